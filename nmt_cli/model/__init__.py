"""The model: the paper's Transformer (transformer: §3 and nothing else), the knobs of Table 3 and
the presets (architecture), the machine-specific fast paths swapped into it from outside
(kernels, and the GPU's own in Triton: triton_kernels), self-describing checkpoints with their
checks and migrations (checkpoint), what a checkpoint keeps of its release (released), and their
average (averaging, §6.1).

It imports the root's foundations and text/."""
