"""ensemble: TensorRT-LLM's ensemble (text in, text out; its I/O names) as a decoupled Python model running
preprocessing -> tensorrt_llm -> postprocessing through BLS calls (trtllm_dasc.serve.text_bls), so that
a client's cancellation reaches the engine: Triton 2.51 does not pass an ensemble platform model's
cancellation on to its running step.
"""
from trtllm_dasc.serve.text_bls import TextModel


class TritonPythonModel(TextModel):
    pass
