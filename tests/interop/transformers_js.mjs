// transformers.js in Node over an `nmt export --format onnx` folder, for tests/interop/test_javascript_routes.py.
// stdin: {"module": the path of transformers.js's transformers.node.mjs, "model": the export's folder,
//         "lines": [...], "dtype": "fp32" or "q8", "generate": generate()'s options, "translate": false for ids only}
// stdout: {"ids": each line's token ids from tokenizer.json, "translations": greedy search's lines}
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const request = JSON.parse(readFileSync(0, 'utf8'));
const { AutoTokenizer, env, pipeline } = await import(pathToFileURL(request.module).href);
env.allowRemoteModels = false;  // local files only: nothing is fetched
env.localModelPath = path.dirname(request.model);
const name = path.basename(request.model);

const tokenizer = await AutoTokenizer.from_pretrained(name);
const ids = request.lines.map((line) => Array.from(tokenizer.encode(line), Number));
const translations = [];
if (request.translate) {
    const translator = await pipeline('translation', name, { dtype: request.dtype, device: 'cpu' });
    // a line at a time: transformers.js's generate() stops a batch only at a step where every row outputs </s>
    for (const line of request.lines) {
        const [output] = await translator(line, { num_beams: 1, do_sample: false, ...request.generate });
        translations.push(output.translation_text);
    }
}
console.log(JSON.stringify({ ids, translations }));
