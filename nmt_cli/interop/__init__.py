"""Models in and out of other toolkits, one module per format and direction: `nmt import` (importer)
of a release read by import_transformers (Hugging Face MarianMTModel), import_marian (Marian's
npz) or import_fairseq (a fairseq checkpoint) into the neutral `Release` (release); `nmt export`
to CTranslate2 (export_ctranslate2) and to transformers (export_transformers) with its model card
(card).

It imports the root's foundations, text/, model/ and decode/."""
