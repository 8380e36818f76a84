"""Pure logic: formats, checks, the findings store, the house's rules; no process, no socket."""
