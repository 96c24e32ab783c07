"""Models in and out of other toolkits, one module per format and direction: `nmt import` (importer)
of a release read by import_transformers (Hugging Face MarianMTModel), import_marian (Marian's
npz), import_fairseq (a fairseq checkpoint) or import_onmt (an OpenNMT-py one) into the neutral
`Release` (release); `nmt export` (exporter) to CTranslate2 (export_ctranslate2), to transformers
(export_transformers) with its model card (card), to ONNX (export_onnx) with the tokenizer of the
JavaScript routes (tokenizer_json), and to a page that translates in the browser (export_web).

It imports the root's foundations, text/, model/ and decode/."""
