"""One scrutiny run: the per-range work (`work`), the engines that distribute it (`engines`), and the
driver with BP-34's re-check and re-read steps (`driver`)."""
