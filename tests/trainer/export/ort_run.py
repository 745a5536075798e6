"""ort_run.py MODEL.onnx INPUT.bin OUTPUT.bin: checks MODEL with onnx's full checker, runs it with ONNX Runtime's
CPU provider on the float32 tensor in INPUT.bin (dims from YOLO8_INPUT_DIMS, e.g. 1,3,128,192), writes output0 as
raw float32 to OUTPUT.bin and prints one JSON line: input name, output0's dims, the onnxruntime and onnx versions,
the file's opset and IR version. Run with .venv/tools/bin/python (scripts/locks/tools.txt, scripts/setup.sh).

Exit status: 0 ran; 1 onnx could not read the file, its checker rejected it, or it did not run; 2 bad arguments.
"""
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort


def fail(message, status=1):
    print(f"ort_run: {message}", file=sys.stderr)
    sys.exit(status)


def main(argv):
    if len(argv) != 4:
        fail("usage: ort_run.py MODEL.onnx INPUT.bin OUTPUT.bin", 2)
    model_path, input_path, output_path = argv[1:]

    # The file as onnx reads it, then the full check (shape inference in strict mode included): a file the checker
    # rejects fails here, before ONNX Runtime, which accepts some files the checker does not, gets to it.
    try:
        model = onnx.load(model_path)
    except Exception as error:  # DecodeError for a truncated or non-ONNX file, OSError for a missing one
        fail(f"onnx cannot read {model_path}: {type(error).__name__}: {error}")
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        fail(f"onnx checker rejected {model_path}: {error}")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)

    data = np.fromfile(input_path, dtype=np.float32)
    # The exported graph is static; the test passes the input size it exported for.
    dims_text = os.environ.get("YOLO8_INPUT_DIMS", "")
    try:
        dims = [int(d) for d in dims_text.split(",")]
    except ValueError:
        dims = []
    if len(dims) != 4 or int(np.prod(dims)) != data.size:
        fail(f"input: YOLO8_INPUT_DIMS={dims_text} does not match {data.size} floats", 2)

    # Every optimisation off: the file's own graph is what runs, not ONNX Runtime's rewrite of it.
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model_path, sess_options=options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    output_names = [o.name for o in session.get_outputs()]
    if "output0" not in output_names:
        fail(f"no output named output0 (got {', '.join(output_names)})")
    (output,) = session.run(["output0"], {input_name: data.reshape(dims)})
    np.ascontiguousarray(output, dtype=np.float32).tofile(output_path)
    print(json.dumps({"input": input_name, "dims": list(output.shape), "ort": ort.__version__,
                      "onnx": onnx.__version__, "opset": opset, "ir": model.ir_version}), flush=True)


if __name__ == "__main__":
    main(sys.argv)
