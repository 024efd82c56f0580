"""A plan's verdict and its evidence (`Plan`): the JSON object and the rich table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tunix_rt.plan.devices import GiB, MiB, DeviceSpec
from tunix_rt.plan.inputs import PlanInputs


@dataclass
class Plan:
    """A plan's verdict and its evidence; `to_json()` is the `tunix-rt plan --json` object."""

    inputs: PlanInputs
    device: DeviceSpec
    items: dict[str, int]
    details: dict[str, Any]
    peak_bytes_per_device: int
    estimators: dict[str, int]
    suggestions: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def capacity_bytes(self) -> int:
        return self.device.capacity_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes_per_device <= self.capacity_bytes

    def to_json(self) -> dict[str, Any]:
        out = {
            "fits": self.fits,
            "peak_bytes_per_device": int(self.peak_bytes_per_device),
            "capacity_bytes": int(self.capacity_bytes),
            "items": {k: int(v) for k, v in self.items.items()},
            "estimators": {k: int(v) for k, v in self.estimators.items()},
            "suggestions": self.suggestions,
            "inputs": {**asdict(self.inputs), "lora_targets": list(self.inputs.lora_targets)},
            "device": {"name": self.device.name, "kind": self.device.kind, "note": self.device.note},
            "details": self.details,
            "notes": self.notes,
        }
        if self.inputs.rl:
            out["peak_phase"] = self.details["peak_phase"]
        return out

    def renderable(self):
        """A rich table, a verdict line and, when it does not fit, the changes that do."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        i = self.inputs
        how = f"{i.engine}, {i.strategy}" if i.engine == "torch" and i.devices > 1 else i.engine
        title = (f"{i.model} {i.method} on {i.devices} x {self.device.name} ({how}): "
                 f"batch {i.batch} x seq {i.seq}, {i.dtype}, {i.optimizer}"
                 + (", remat" if i.remat else "") + (f", {i.weight_qtype}" if i.weight_qtype else "")
                 + (f"; {'RL step' if i.trains_on_rollouts else 'sampling'}: {i.rl_prompts} prompts x "
                    f"{i.group_size} samples, up to {i.rollout_tokens} new tokens" if i.rl else ""))
        table = Table()
        table.add_column("item")
        table.add_column("per device", justify="right")
        if i.rl:
            table.add_column("phase")
        for k, v in self.items.items():
            table.add_row(k, fmt_bytes(v), *([RL_ITEM_PHASE.get(k, "both")] if i.rl else []))
        for name, v in self.details.get("phases", {}).items():
            peak = " (the peak)" if name == self.details["peak_phase"] else ""
            table.add_row(f"[bold]{name} phase{peak}[/bold]", f"[bold]{fmt_bytes(v)}[/bold]", name)
        for k, v in self.estimators.items():
            table.add_row(f"[bold]estimate: {k}[/bold]", f"[bold]{fmt_bytes(v)}[/bold]", *([""] if i.rl else []))
        table.add_row("capacity", fmt_bytes(self.capacity_bytes), *([""] if i.rl else []))
        formula = Text("peak = " + self.details["peak_formula"], style="dim")
        verdict = Text(
            f"{'FITS' if self.fits else 'DOES NOT FIT'}: predicted peak {fmt_bytes(self.peak_bytes_per_device)} "
            f"of {fmt_bytes(self.capacity_bytes)} per device ({self.peak_bytes_per_device / self.capacity_bytes:.0%})",
            style="bold green" if self.fits else "bold red",
        )
        parts: list[Any] = [Text(title, style="bold"), table, formula, verdict]
        parts += [Text(f"note: {n}", style="dim") for n in self.notes]
        if not self.fits:
            if self.suggestions:
                sug = Table(title="changes that make it fit (cheapest first)", title_justify="left")
                sug.add_column("change")
                sug.add_column("predicted peak", justify="right")
                for s in self.suggestions:
                    sug.add_row(s["change"], fmt_bytes(s["peak_bytes_per_device"]))
                parts.append(sug)
            else:
                parts.append(Text("no single or paired change we know makes it fit", style="red"))
        return Group(*parts)

    def render(self) -> str:
        """The same as plain text (for logs and error messages)."""
        from io import StringIO

        from rich.console import Console

        buf = StringIO()
        Console(file=buf, width=100, color_system=None, force_terminal=False).print(self.renderable())
        return buf.getvalue()


#: which phase of an RL step holds an item (the rest, weights and optimizer state, both)
RL_ITEM_PHASE = {"gradients": "update", "activations": "update", "loss_head": "update", "rl_aux": "update",
                 "teacher_forward": "update", "teacher_loss_head": "update",
                 "rollout_cache": "rollout", "rollout_workspace": "rollout",
                 "workspace": "the peak's"}


def fmt_bytes(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= 0.1 * GiB else f"{n / MiB:.1f} MiB"
