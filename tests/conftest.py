"""Shared test helpers. Real data is read from ../shared/data (or $NMT_SHARED_DATA), never copied
into the repository; where it is absent (a fresh clone on a user's machine), Multi30k is fetched
once as users get it (data/get_multi30k.sh) into the user's cache, and the tests that need what
cannot be had are skipped, saying why."""

import contextlib
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("NMT_SHARED_DATA", ROOT.parent / "shared" / "data"))
USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nmt-cli"
EN_MG = SHARED_DATA / "opus-mt-en-mg"  # a released OPUS-MT model's configuration and tokenizer files
SMALL_MARIAN = {"d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "num_hidden_layers": 2,
                "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "encoder_attention_heads": 4,
                "decoder_attention_heads": 4}


NEEDS_CTRANSLATE2 = pytest.mark.skipif(importlib.util.find_spec("ctranslate2") is None,
                                       reason="CTranslate2 is not installed (the export and dev extras have it)")
SERVERS: list = []  # the `nmt serve` processes that `serving` started
GPU: dict = {}  # on a machine with a GPU: torch.cuda.is_available itself, CUDA_VISIBLE_DEVICES as it was


@pytest.fixture(scope="session", autouse=True)
def cpu_unless_marked_gpu():
    """The suite's oracles are the CPU's (CI has no GPU): on a machine with one, device auto means
    the CPU in every test but those marked `gpu` (test_gpu.py, the cuda cases), in this process
    and in the processes it starts. CUDA starts here first, while the GPU is visible, so that the
    `gpu` tests of this process have it, and counts the devices then: torch caches the first count
    after CUDA starts, which would be 0 if a CPU test asked first."""
    import torch

    if not torch.cuda.is_available():
        yield
        return
    torch.cuda.init()
    torch.cuda.device_count()
    GPU.update(is_available=torch.cuda.is_available, visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        patch.setenv("CUDA_VISIBLE_DEVICES", "")
        yield


@pytest.fixture(scope="session", autouse=True)
def threads_shared_with_the_other_workers():
    """Side by side (pytest-xdist), each worker's PyTorch takes its share of the cores, not all of
    them: threads that outnumber the cores run everything slower."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(autouse=True)
def gpu_when_marked(request, monkeypatch):
    """A test marked `gpu` sees the GPU (see cpu_unless_marked_gpu)."""
    if GPU and request.node.get_closest_marker("gpu") is not None:
        import torch

        monkeypatch.setattr(torch.cuda, "is_available", GPU["is_available"])
        if GPU["visible"] is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", GPU["visible"])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With $NMT_TEST_FAILURES set (tests/benchmarks/gpu_check.sh), each failure is written there
    as it happens, by the controlling process: a run cut off at its time limit still says why."""
    path = os.environ.get("NMT_TEST_FAILURES")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


@pytest.fixture(scope="session", autouse=True)
def no_server_left():
    """A server that a failing test could not stop is killed when the session ends, first made to
    write its threads' stacks into its log (faulthandler, on SIGABRT), which goes to
    $NMT_TEST_FAILURES too when set."""
    import signal
    import subprocess

    yield
    for process, log in SERVERS:
        if process.poll() is None:
            process.send_signal(signal.SIGABRT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if os.environ.get("NMT_TEST_FAILURES"):
                with open(os.environ["NMT_TEST_FAILURES"], "a", encoding="utf-8") as out:
                    out.write(f"=== a server left running: {log}\n{log.read_text()[-20000:]}\n\n")


@functools.cache
def find_multi30k() -> tuple[Path | None, str]:
    """Multi30k's directory: the shared data's, else the user's cache, filled by data/get_multi30k.sh
    (a download) the first time; or None and why it could not be had. Benchmarks run by the tests
    find it where the tests did ($NMT_SHARED_DATA)."""
    shared = SHARED_DATA / "multi30k"
    if (shared / "train.en").is_file():
        return shared, ""
    cache = USER_CACHE / "multi30k"
    done = subprocess.run(["bash", str(ROOT / "data/get_multi30k.sh"), str(cache)], capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no reason given"])[-1]
        return None, f"Multi30k is not at {shared} (set NMT_SHARED_DATA) and could not be fetched into {cache}: {why}"
    os.environ["NMT_SHARED_DATA"] = str(USER_CACHE)
    return cache, ""


def multi30k_lines(n: int, lang: str = "en", split: str = "train") -> list[str]:
    """The first `n` lines of a Multi30k split in `lang` (find_multi30k), or the test is skipped."""
    path, why = find_multi30k()
    if path is None:
        pytest.skip(why)
    return head(path / f"{split}.{lang}", n)


@pytest.fixture(scope="session")
def multi30k() -> Path:
    """Multi30k en/de/fr (find_multi30k), or the test is skipped saying why."""
    path, why = find_multi30k()
    if path is None:
        pytest.skip(why)
    return path


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def head(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


SYMBOLS = "abcdefghijklmnop"


def synthetic_pairs(n: int, seed: int, task: str = "reverse", min_len: int = 3, max_len: int = 8):
    """Sequences of letters and their transduction: `reverse`, `copy`, or `upper` (copy in capitals:
    another vocabulary)."""
    import random

    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        seq = [rng.choice(SYMBOLS) for _ in range(rng.randint(min_len, max_len))]
        out = seq[::-1] if task == "reverse" else [s.upper() for s in seq] if task == "upper" else seq
        pairs.append((" ".join(seq), " ".join(out)))
    return pairs


def synthetic_data_dir(tmp_path: Path, n_train: int = 400, n_valid: int = 40, task: str = "reverse",
                       seed: int = 0, joined_dictionary: bool = True, **kwargs) -> Path:
    """A data directory made by `nmt preprocess` from a synthetic task (whitespace tokens, no BPE)."""
    from nmt_cli.config import PreprocessConfig, TextConfig
    from nmt_cli.corpus.preprocess import preprocess

    raw = tmp_path / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, n, split_seed in (("train", n_train, seed), ("valid", n_valid, seed + 1000)):
        pairs = synthetic_pairs(n, split_seed, task, **kwargs)
        write_lines(raw / f"{split}.src", [s for s, _ in pairs])
        write_lines(raw / f"{split}.tgt", [t for _, t in pairs])
    dest = tmp_path / "data"
    preprocess(PreprocessConfig(TextConfig("src", "tgt", tokenizer="none"), dest, str(raw / "train"),
                                 str(raw / "valid"), bpe_merges=0, workers=1, progress=False, max_len_ratio=10,
                                 joined_dictionary=joined_dictionary))
    return dest


def tiny_checkpoint(path: Path, seed: int = 0, symbols: Sequence[str] = SYMBOLS, max_positions: int = 64,
                    **overrides) -> Path:
    """An untrained tiny model over whitespace tokens, saved as a self-describing checkpoint."""
    import torch

    from nmt_cli.config import TextConfig
    from nmt_cli.model import checkpoint as ckpt
    from nmt_cli.model.architecture import PRESETS
    from nmt_cli.model.transformer import Transformer
    from nmt_cli.text.vocab import PAD_ID, Vocabulary

    torch.manual_seed(seed)
    vocab = Vocabulary(list(symbols))
    config = PRESETS["small"].replace(**{"encoder_layers": 1, "decoder_layers": 1, "d_model": 32, "d_ff": 64,
                                         "heads": 2, "max_positions": max_positions, **overrides})
    model = Transformer(config, len(vocab), len(vocab), PAD_ID, True)
    ckpt.save(ckpt.describe(model, TextConfig("src", "tgt", tokenizer="none"), None, vocab, vocab), path)
    return path


def tiny_sentencepiece_checkpoint(path: Path, seed: int = 0, lines: list[str] | None = None, vocab_size: int = 40,
                                  vocabulary: Callable[[list[str]], list[str]] = list, **overrides) -> Path:
    """An untrained tiny model over the pieces of a small SentencePiece model (a joint vocabulary)
    of `lines` (default: the synthetic tasks' letters), saved as a self-describing checkpoint;
    `vocabulary` makes the model's tokens of the pieces, `overrides` its settings (tiny_checkpoint's)."""
    from nmt_cli.config import TextConfig
    from nmt_cli.model import checkpoint as ckpt
    from nmt_cli.text.pieces import learn_sentencepiece, load_sentencepiece

    lines = lines or [s for pair in synthetic_pairs(200, seed, "upper") for s in pair]
    pieces = learn_sentencepiece(lines, vocab_size, "unigram")
    processor = load_sentencepiece(pieces)
    tokens = [processor.id_to_piece(i) for i in range(4, processor.get_piece_size())]
    tiny_checkpoint(path, seed, vocabulary(tokens), **overrides)
    bundle = ckpt.load_bundle(path)
    text = TextConfig(bundle.text.source_lang, bundle.text.target_lang, subword="sentencepiece")
    ckpt.save(ckpt.describe(bundle.model, text, None, bundle.src_vocab, bundle.tgt_vocab, pieces), path)
    return path


def block_import(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    """Make `import PREFIX...` fail, as on a machine without that optional package."""
    import builtins

    real_import = builtins.__import__

    def blocked(name, *args, **kwargs):
        if name.startswith(prefix):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", blocked)


# .item(), int(), bool(), .tolist(), x[mask]...: operations that make the host wait for the device
HOST_READS = ("_local_scalar_dense", "nonzero", "equal", "is_nonzero", "masked_select")


def replayed(step, device=None, pool=None):
    """A CUDA graph emulated on the CPU, to test code meant for `graphs.capture`: `step` runs
    once (as capture's warm-up does) while every aten operation it makes is recorded, and the
    callable returned replays those operations, and only those: a Python value (a shape, an
    int, a branch taken) stays what it was at the recording, a tensor made outside `step` is
    that same tensor with whatever it then holds, and a tensor made inside is made anew. A read
    back to the host fails, as it fails a CUDA graph's capture."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten, tree_map

    class Made:  # a reference to the output of an earlier operation
        def __init__(self, slot: int) -> None:
            self.slot = slot

    class Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.operations, self.made = [], {}  # id -> (slot, tensor): tensors made inside

        def ref(self, x):
            made = self.made.get(id(x)) if isinstance(x, torch.Tensor) else None
            return Made(made[0]) if made is not None and made[1] is x else x

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.__name__.split(".")[0]
            masks = [x for x in tree_flatten(args)[0] if isinstance(x, torch.Tensor) and x.dtype == torch.bool]
            if name in HOST_READS or (name in ("index", "index_put", "index_put_") and masks):  # x[mask]: nonzero
                raise AssertionError(f"{func} reads back to the host: a CUDA graph cannot hold it")
            template = tree_map(self.ref, (args, kwargs))
            out = func(*args, **kwargs)
            given = {id(x) for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)}
            slots = []
            for x in tree_flatten(out)[0]:
                new = isinstance(x, torch.Tensor) and id(x) not in given and id(x) not in self.made
                if new:
                    self.made[id(x)] = (len(self.made), x)
                slots.append(self.made[id(x)][0] if new else None)
            self.operations.append((func, template, slots))
            return out

    recorder = Recorder()
    with recorder:
        result = step()
    operations, result = recorder.operations, recorder.ref(result)
    recorder.made.clear()

    def replay():
        made = {}

        def value(x):
            return made[x.slot] if isinstance(x, Made) else x

        for func, template, slots in operations:
            args, kwargs = tree_map(value, template)
            for slot, x in zip(slots, tree_flatten(func(*args, **kwargs))[0]):
                if slot is not None:
                    made[slot] = x
        return value(result)

    return replay


def cli(*args, input=None):
    """`nmt ARGS` in this process, as click's test runner runs it."""
    from click.testing import CliRunner

    from nmt_cli.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def val_translations(model: Path, beam: int) -> list[str]:
    """`nmt translate` (CPU) of Multi30k's first 20 val lines, raw, as the peers' fixtures
    (tests/fixtures/*/make.sh) translated them: its lines."""
    result = cli("translate", "-m", model, "--beam", beam, "--device", "cpu",
                 input="".join(line + "\n" for line in multi30k_lines(20, "en", "val")))
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def val_reference_records(model: Path) -> list[dict]:
    """`nmt translate --score-reference --format jsonl` (CPU) of Multi30k's first 20 val pairs, as
    the peers' fixtures scored them: a record a line."""
    import json

    pairs = zip(multi30k_lines(20, "en", "val"), multi30k_lines(20, "de", "val"))
    result = cli("translate", "-m", model, "--score-reference", "--format", "jsonl", "--device", "cpu",
                 input="".join(f"{source}\t{reference}\n" for source, reference in pairs))
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder that `build` fills, made once in a test run: the first of xdist's workers to ask
    builds it under a lock, the others wait and find it, and so does a parametrized session fixture
    set up again (pytest keeps one parameter's value at a time). Its users only read it."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    folder, done = root / name, root / f"{name}.built"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session", params=["shared", "separate"])
def exported(request, tmp_path_factory):
    """A tiny SentencePiece model trained for seconds to copy letters (shared vocabulary) or copy
    them in capitals (separate vocabularies), exported; with the raw valid sources. Built once a
    run (`built_once`)."""
    from nmt_cli.model import checkpoint as ckpt

    shared = request.param == "shared"
    tmp = built_once(tmp_path_factory, f"exported-{request.param}", functools.partial(train_and_export, shared=shared))
    bundle = ckpt.load_bundle(tmp / "ck/checkpoint_last.pt")
    assert (bundle.src_vocab is bundle.tgt_vocab) == shared
    sources = (tmp / "raw/valid.src").read_text().splitlines()
    return tmp, bundle, sources


def train_and_export(tmp: Path, shared: bool) -> None:
    """`exported`'s model, trained in `tmp` (raw/, data/, ck/) and exported for transformers (hf/)."""
    from nmt_cli.config import TrainConfig
    from nmt_cli.model.architecture import PRESETS
    from nmt_cli.train.run import TrainingRun

    (tmp / "raw").mkdir()
    for split, n, seed in (("train", 400, 0), ("valid", 40, 1000)):
        pairs = synthetic_pairs(n, seed, "copy" if shared else "upper")
        write_lines(tmp / f"raw/{split}.src", [s for s, _ in pairs])
        write_lines(tmp / f"raw/{split}.tgt", [t for _, t in pairs])
    result = cli("preprocess", "-s", "src", "-t", "tgt", "--trainpref", tmp / "raw/train", "--validpref",
                 tmp / "raw/valid", "--destdir", tmp / "data", "--subword", "sentencepiece", "--vocab-size", 40,
                 *([] if shared else ["--separate-dictionaries"]), "--quiet", "--workers", 1)
    assert result.exit_code == 0, result.output
    model = PRESETS["small"].replace(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4, dropout=0.0,
                                     max_positions=64)
    config = TrainConfig(max_tokens=400, lr_schedule="inverse-sqrt", lr=3e-3, warmup=30, max_updates=400,
                         device="cpu", threads=1, save_interval_minutes=1000.0, eval_bleu=not shared,
                         validate_interval_updates=200)
    TrainingRun(tmp / "data", tmp / "ck", model, config, progress_bar=False).run()
    result = cli("export", "-m", tmp / "ck/checkpoint_last.pt", "--format", "transformers", "-o", tmp / "hf")
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="session")
def transformers_js() -> Path:
    """transformers.js's Node module, installed from npm once into a cache folder (NMT_NODE_CACHE,
    default ~/.cache/nmt-cli/node), with --ignore-scripts: onnxruntime-node's install script
    fetches GPU binaries from a host that may be unreachable, and its CPU binary is in the package.
    Skips where Node or npm is absent or the install fails; workers installing at once each install
    into a folder of their own and the first to finish is kept."""
    import shutil
    import tempfile

    from nmt_cli.interop.export_web import TRANSFORMERS_JS  # the version the page is made for

    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("needs Node.js and npm (the JavaScript routes' tests run transformers.js)")
    cache = Path(os.environ.get("NMT_NODE_CACHE", Path.home() / ".cache" / "nmt-cli" / "node"))
    home = cache / f"transformers-{TRANSFORMERS_JS}"
    module = Path("node_modules/@huggingface/transformers/dist/transformers.node.mjs")
    if not (home / module).exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache))
        (tmp / "package.json").write_text('{"private": true}\n')
        done = subprocess.run(["npm", "install", "--ignore-scripts", "--no-audit", "--no-fund",
                               f"@huggingface/transformers@{TRANSFORMERS_JS}"], cwd=tmp, capture_output=True,
                              text=True, timeout=600)
        try:
            if done.returncode != 0:
                pytest.skip(f"npm could not install transformers.js: {done.stderr.strip().splitlines()[-1:]}")
            tmp.rename(home)
        except OSError:  # another worker's install came first
            pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return home / module


def run_transformers_js(module: Path, model: Path, lines: list[str], translate: bool = True,
                        dtype: str = "fp32", **generate) -> dict:
    """tests/interop/transformers_js.mjs in Node: each line's ids from the export's tokenizer.json
    and (`translate`) its greedy translation with transformers.js (`generate`: generate()'s options)."""
    import json

    script = Path(__file__).resolve().parent / "interop" / "transformers_js.mjs"
    request = {"module": str(module), "model": str(model), "lines": lines, "dtype": dtype, "generate": generate,
               "translate": translate}
    done = subprocess.run(["node", str(script)], input=json.dumps(request), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def opus_mt_release(directory: Path, seed: int = 0, eos: int = 0, bos: int | None = None, codes: tuple[str, ...] = (),
                    target_size: int | None = None, **changes):
    """A released en-mg model directory as the Hub has it (config.json with the generation settings
    in it, no generation_config.json), smaller, with random weights (`changes`: to config.json;
    `eos`: the id of </s>, 0 in en-mg, 44670 in tc-big releases; `bos`: the id of an ordinary
    `<s>` entry, 44671 in tc-big releases, none in en-mg; `codes`: target language tags such as
    `>>fra<<` that a multilingual release's source vocabulary holds; `target_size`: separate
    vocabularies, the target's that many of the source's tokens in another order, with `<pad>` at
    its end and at the same id in the source's); and that MarianMTModel."""
    import json
    import shutil

    import torch
    import transformers

    if not (EN_MG / "config.json").is_file():
        pytest.skip(f"opus-mt-en-mg not found at {EN_MG} (set NMT_SHARED_DATA)")
    config = {**json.loads((EN_MG / "config.json").read_text()), **SMALL_MARIAN, **changes}
    if eos:
        config.update(eos_token_id=eos, forced_eos_token_id=eos)
    if target_size:
        config.update(decoder_vocab_size=target_size, pad_token_id=target_size - 1,
                      decoder_start_token_id=target_size - 1, share_encoder_decoder_embeddings=False,
                      bad_words_ids=[[target_size - 1]])
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(transformers.MarianConfig.from_dict(config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:  # layer norms too: none is 1 or 0, so a misplaced one shows
                p.normal_(1.0 if name.endswith("layer_norm.weight") else 0.0, 0.15 if p.dim() > 1 else 0.1)
        model.final_logits_bias.normal_(0, 1.0)
    model.save_pretrained(directory)
    (directory / "generation_config.json").unlink()
    (directory / "config.json").write_text(json.dumps(config))
    for name in ("source.spm", "target.spm", "tokenizer_config.json"):
        shutil.copy(EN_MG / name, directory / name)
    vocab = json.loads((EN_MG / "vocab.json").read_text())
    if eos:  # </s> and the token at `eos` change places
        other = next(token for token, i in vocab.items() if i == eos)
        vocab[other], vocab["</s>"] = vocab["</s>"], eos
    if bos is not None:  # the token at `bos` is renamed <s>
        del vocab[next(token for token, i in vocab.items() if i == bos)]
        vocab["<s>"] = bos
    for code, i in zip(codes, range(54000, 54687)):  # a tag takes the place of an ordinary token
        vocab = {token: j for token, j in vocab.items() if j != i} | {code: i}
    if target_size:
        vocab = separate_target(directory, vocab, target_size, seed)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return model


def separate_target(directory: Path, vocab: dict[str, int], size: int, seed: int) -> dict[str, int]:
    """Writes target_vocab.json (`size` tokens: </s> and <unk> where the source has them, a random
    draw of its other tokens, <pad> last) and separate_vocabs to tokenizer_config.json; returns the
    source vocabulary with <pad> at the target's id of it (the config's one pad_token_id)."""
    import json
    import random

    pad = size - 1
    by_id = sorted(vocab, key=vocab.get)
    source = dict(vocab) | {by_id[pad]: vocab["<pad>"], "<pad>": pad}
    ordinary = [t for t in by_id if t not in ("</s>", "<unk>", "<pad>")]
    drawn = random.Random(seed).sample(ordinary, size - 3)
    target = {"</s>": vocab["</s>"], "<unk>": vocab["<unk>"]}
    target |= dict(zip(drawn, (i for i in range(size) if i not in (*target.values(), pad)))) | {"<pad>": pad}
    (directory / "target_vocab.json").write_text(json.dumps(target, ensure_ascii=False), encoding="utf-8")
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps(settings | {"separate_vocabs": True}))
    return source


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body: object = None) -> tuple[int, dict]:
    """The status and JSON answer of a GET (or, with `body`, a POST) to `url`."""
    import json
    import urllib.error
    import urllib.request

    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@contextlib.contextmanager
def static_server(folder: Path) -> Iterator[str]:
    """`folder` served by a static HTTP server on 127.0.0.1 (a free port), quietly, while in the
    block; yields its origin (http://127.0.0.1:PORT/)."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


def serving(tmp_path: Path, *options, model: Path | str | None = None, device: str = "cpu",
            files: int | None = None, host: str = "127.0.0.1"):
    """`nmt serve` of `model` (default: an untrained tiny one; or SRC-TGT=PATH) on a free port of
    `host`, once it answers; `files`: its open-file limit (soft and hard)."""
    import resource
    import subprocess
    import sys
    import time

    model = model or tiny_checkpoint(tmp_path / "m.pt", seed=3)
    port = free_port()
    log = tmp_path / "serve.log"  # a file, not a pipe nobody reads
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "nmt_cli", "serve", "-m", str(model),
                                    "--port", str(port), "--host", host, "--device", device, "--threads", "1",
                                    *map(str, options)],
                                   stdout=out, stderr=out, preexec_fn=files and (
                                       lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))))
    SERVERS.append((process, log))
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if request(url + "/health")[0] == 200:
                return model, url, process
        except OSError:
            time.sleep(0.2)
    process.kill()
    process.wait()
    raise AssertionError(f"the server did not start: {log.read_text()[-2000:]}")


ARGOS = "argos-translate-lt==1.12.1"  # the argostranslate LibreTranslate 1.9.6 installs
LIBRETRANSLATE = "libretranslate==1.9.6"


def cached_venv(name: str, requirement: str) -> Path:
    """The interpreter of a virtual environment of `requirement`'s own, installed from PyPI once into
    the user's cache (NMT_VENV_CACHE, default ~/.cache/nmt-cli) under a lock; skips, saying why,
    where pip cannot install it."""
    from filelock import FileLock

    home = Path(os.environ.get("NMT_VENV_CACHE") or USER_CACHE) / name
    home.parent.mkdir(parents=True, exist_ok=True)
    python = home / "bin" / "python"
    with FileLock(f"{home}.lock"):
        if not (home / "installed").exists():
            shutil.rmtree(home, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, capture_output=True)
            done = subprocess.run([str(python), "-m", "pip", "install", "-q", requirement], capture_output=True,
                                  text=True, timeout=1200)
            if done.returncode != 0:
                pytest.skip(f"pip could not install {requirement}: {done.stderr.strip().splitlines()[-1:]}")
            (home / "installed").touch()
    return python


@pytest.fixture(scope="session")
def argos_python() -> Path:
    return cached_venv("argos-translate-lt-1.12.1", ARGOS)


@pytest.fixture(scope="session")
def libretranslate_python() -> Path:
    return cached_venv("libretranslate-1.9.6", LIBRETRANSLATE)
