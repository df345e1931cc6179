"""A benchmark's row: a figure measured beside its floor in the same run."""
import dataclasses
import statistics
import time


@dataclasses.dataclass
class Row:
    figure: str
    ours: list[float]
    floor: list[float]
    unit: str
    verdict: str
    target: str

    def cells(self) -> list[str]:
        def fmt(values: list[float]) -> str:
            return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"
        return [self.figure, f"{fmt(self.ours)} {self.unit}", f"{fmt(self.floor)} {self.unit}", self.verdict,
                self.target]


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def ratio_row(figure: str, ours: list[float], floor: list[float], unit: str, limit: float) -> Row:
    ratio = statistics.median(ours) / statistics.median(floor)
    return Row(figure, ours, floor, unit, f"ratio {ratio:.2f} {'PASS' if ratio <= limit else 'MISS'}",
               f"ratio <= {limit}")
