"""tensorrt_llm_bls: TensorRT-LLM's BLS model (text in, text out) as Python calls:
preprocessing -> tensorrt_llm -> postprocessing. The code lives in trtllm_dasc.serve.text_bls (the
ensemble model runs it too); a client's cancellation reaches the engine as a stop for this request.
"""
from trtllm_dasc.serve.text_bls import TextModel


class TritonPythonModel(TextModel):
    pass
