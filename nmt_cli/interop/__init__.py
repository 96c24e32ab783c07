"""Models in and out of other toolkits, one module per format and direction, listed in one table
(formats: each reader and writer, its module, files and options) with one neutral description
between them (release.Release in, a checkpoint out): `nmt import` (importer) of a release read by
import_transformers (Hugging Face MarianMTModel), import_marian (Marian's npz), import_fairseq (a
fairseq checkpoint), import_onmt (an OpenNMT-py one), import_ctranslate2 (a CTranslate2 model, its
model.bin read by model_bin) or import_argos (an Argos Translate package), with the reading they
share (reading); `nmt export` (exporter) to CTranslate2 (export_ctranslate2), to an Argos Translate
package (export_argos) with its sentence splitter (sentence_splitter), to transformers
(export_transformers) with its model card (card), to ONNX (export_onnx) with the tokenizer of the
JavaScript routes (tokenizer_json), and to a page that translates in the browser (export_web), with
the writing they share (writing: the output folder, the text pipeline's files).

It imports the root's foundations, text/, model/ and decode/."""
