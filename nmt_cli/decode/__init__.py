"""Translation: the decoder run one position at a time over caches (incremental) and as CUDA
graphs (graphs), one search step of a model or an ensemble (ensemble) under the output rules
(controls) and terms (constraints), beam search (search) and sampling (sampling), minimum Bayes
risk's choice among their candidates (mbr), a lexical shortlist (shortlist), batches of token ids
searched on a device (generator), text to ids and back (pipeline), what is returned (records),
the steps of a translation that the commands and the server compose (engine), the Python API over
them (translator) and `nmt translate` (translate).

It imports the root's foundations, text/, model/ and corpus/."""
