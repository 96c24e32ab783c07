"""Training (§5): `nmt train` (run), one update (trainer), where a process runs (runtime), the
batches of each epoch (epochs), the learning rate (schedule), torchrun's other processes
(peers) and what they must share (agreement), where a run stands (progress), what it reports
(runlog) and its save directory (savedir).

It imports the root's foundations, text/, model/, corpus/ and decode/."""
