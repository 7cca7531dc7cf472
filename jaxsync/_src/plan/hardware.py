"""The accelerators people plan with: peak dense bf16 FLOP/s, and where each figure comes from."""

from __future__ import annotations

import dataclasses

from jaxsync._src.core import validation


@dataclasses.dataclass(frozen=True)
class Accelerator:
  """One chip: its peak dense bf16 FLOP/s (no sparsity) and the source of the figure.

  Attributes:
    name: the preset's name.
    peak_flops: dense bf16 FLOP/s of one chip.
    source: where the figure is published.
  """

  name: str
  peak_flops: float
  source: str


ACCELERATORS: dict[str, Accelerator] = {
  a.name: a
  for a in (
    Accelerator(
      "H100",
      989e12,
      "NVIDIA H100 Tensor Core GPU datasheet: H100 SXM, BF16 Tensor Core 1,979 TFLOPS with sparsity",
    ),
    Accelerator(
      "H200",
      989e12,
      "NVIDIA H200 Tensor Core GPU datasheet: H200 SXM, BF16 Tensor Core 1,979 TFLOPS with sparsity",
    ),
    Accelerator(
      "B200", 2.25e15, "NVIDIA HGX B200 datasheet: FP16/BF16 Tensor Core 4.5 PFLOPS per GPU with sparsity"
    ),
    Accelerator("TPU v5p", 459e12, "Google Cloud TPU v5p documentation: 459 TFLOPS bf16 peak per chip"),
    Accelerator("TPU v5e", 197e12, "Google Cloud TPU v5e documentation: 197 TFLOPS bf16 peak per chip"),
  )
}


def accelerator(name: str) -> Accelerator:
  """The preset ``name`` (``H100``, ``H200``, ``B200``, ``TPU v5p``, ``TPU v5e``)."""
  if name not in ACCELERATORS:
    raise validation.invalid("plan", "hardware", name, f"one of {', '.join(ACCELERATORS)}")
  return ACCELERATORS[name]
