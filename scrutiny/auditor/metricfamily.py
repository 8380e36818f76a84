"""A metric family declared once: its type, name, help and labels. A collector's `describe()` yields its families
empty and its `collect()` fills them, so the two can never name different metrics."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


@dataclass(frozen=True)
class Family:
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily]
    name: str
    doc: str
    labels: tuple[str, ...] = ()

    def empty(self) -> GaugeMetricFamily | CounterMetricFamily:
        return self.kind(self.name, self.doc, labels=list(self.labels))

    def of(self, samples: Iterable[tuple[Iterable[str], float]]) -> Metric:
        family = self.empty()
        for labels, value in samples:
            family.add_metric(list(labels), value)
        return family

    def value(self, value: float) -> Metric:
        return self.of([((), value)])


class FamiliesCollector:
    """A prometheus_client collector whose families are `families`: registering it checks their names."""

    families: tuple[Family, ...] = ()

    def describe(self) -> Iterator[Metric]:
        return (f.empty() for f in self.families)

    def collect(self) -> Iterator[Metric]:
        raise NotImplementedError
