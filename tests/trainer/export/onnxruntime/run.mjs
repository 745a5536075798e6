// node run.mjs MODEL.onnx INPUT.bin OUTPUT.bin: runs MODEL with ONNX Runtime's CPU provider on the float32 tensor
// in INPUT.bin (shape from the model's input), writes output0 as raw float32 to OUTPUT.bin and prints its shape.
import { readFileSync, writeFileSync } from "node:fs";
import * as ort from "onnxruntime-node";

const [modelPath, inputPath, outputPath] = process.argv.slice(2);
if (!outputPath) {
  console.error("usage: node run.mjs MODEL.onnx INPUT.bin OUTPUT.bin");
  process.exit(2);
}
// Every optimisation off: the file's own graph is what runs, not ONNX Runtime's rewrite of it.
const session = await ort.InferenceSession.create(modelPath, { graphOptimizationLevel: "disabled" });
const bytes = readFileSync(inputPath);
const data = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
const input = session.inputNames[0];
// The exported graph is static; the test passes the input size it exported for.
const dims = (process.env.YOLO8_INPUT_DIMS || "").split(",").map(Number);
if (dims.length !== 4 || dims.reduce((a, b) => a * b, 1) !== data.length) {
  console.error(`input: YOLO8_INPUT_DIMS=${process.env.YOLO8_INPUT_DIMS} does not match ${data.length} floats`);
  process.exit(2);
}
const results = await session.run({ [input]: new ort.Tensor("float32", data, dims) });
const output = results.output0;
if (!output) {
  console.error(`no output named output0 (got ${Object.keys(results).join(", ")})`);
  process.exit(1);
}
writeFileSync(outputPath, Buffer.from(output.data.buffer, output.data.byteOffset, output.data.byteLength));
console.log(JSON.stringify({ input, dims: output.dims, ort: ort.env.versions.node }));
