"""The doctor's plot (``tfaccel doctor --plot FILE``, ``DoctorReport.plot``): loss and global gradient norm per step,
one replica against N, with the first step where the runs part marked."""

from typing import Any, Dict, List, Optional

from tfaccel._lazy import optional_module
from tfaccel.errors import ConfigError

__all__ = ["plot_report"]


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed); matplotlib is the optional ``doctor`` extra."""
    try:
        optional_module("matplotlib").use("Agg")
    except ImportError:
        raise ConfigError("doctor: --plot needs matplotlib, which is not installed; pip install 'tfaccel[doctor]' "
                          "(or leave --plot out)") from None
    return optional_module("matplotlib.pyplot")


def _series(rows: List[Dict[str, Any]], key: str, run: int) -> List[float]:
    return [float("nan") if row[key][run] is None else row[key][run] for row in rows]


def plot_report(report: Dict[str, Any], path: str) -> None:
    """Writes a PNG of the report's loss and gradient norm per step for both runs (the report as ``to_json`` gives
    it).

    Raises:
        ConfigError: matplotlib is not installed, or ``path`` cannot be written.
    """
    plt = _pyplot()
    rows = report["verdict"]["rows"]
    steps = [row["step"] for row in rows]
    runs = [f"{run['replicas']} replica{'s' if run['replicas'] > 1 else ''} ({run['strategy']})"
            for run in report["runs"]]
    first: Optional[Dict[str, Any]] = report["verdict"]["first"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "loss", "loss"), (axes[1], "grad_norm", "global gradient norm")):
        for run, (label, style) in enumerate(zip(runs, ("o-", "x--"))):
            ax.plot(steps, _series(rows, key, run), style, label=label)
        if first is not None:
            ax.axvline(first["step"], color="red", linestyle=":", label=f"runs part: {first['quantity']}"[:60])
        ax.set_xticks(steps)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.legend(fontsize=7)
    verdict = "equal to rounding" if report["equal"] else f"the runs part at step {first['step']}"
    causes = ", ".join(c["name"] for c in report["causes"])
    fig.suptitle(f"tfaccel doctor: {verdict}" + (f"; likely cause: {causes}" if causes else ""), fontsize=9)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100, format="png")
    except OSError as exc:
        raise ConfigError(f"doctor: --plot {path!r} cannot be written: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
