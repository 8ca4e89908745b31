"""postprocessing: token ids -> text, TensorRT-LLM's postprocessing model.

TOKENS_BATCH is [batch, beam, tokens] and SEQUENCE_LENGTH [batch, beam]; each beam's first
SEQUENCE_LENGTH tokens are decoded (special tokens skipped unless skip_special_tokens is false). OUTPUT is
flat, [batch * beam] in batch-major order, whatever config.pbtxt's dims say: TensorRT-LLM's model returns
it so and its clients read ``text_output[0]`` as the text. Streamed chunks are decoded one by one, as TensorRT-LLM does; with a byte-level
tokenizer (the default model's) the decoded chunks concatenate to the decoded whole, since a piece carries
its own leading space (a character whose UTF-8 bytes are split across two chunks is the exception).
"""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from trtllm_dasc.errors import UserError
from trtllm_dasc.serve.tokenizer import TextTokenizer, model_parameter, parse_bool


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        tokenizer_dir = model_parameter(config, "tokenizer_dir")
        # relative to this model's directory: an engine directory (repository and model inside) can move
        self.tokenizer = TextTokenizer(os.path.join(args["model_repository"], tokenizer_dir))
        self.skip_special = parse_bool(model_parameter(config, "skip_special_tokens"), "skip_special_tokens")

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=[self._one(request)]))
            except UserError as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
        return responses

    def _one(self, request):
        tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
        lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
        if lengths.shape != tokens.shape[:2]:
            raise UserError(f"SEQUENCE_LENGTH has shape {list(lengths.shape)}, TOKENS_BATCH "
                            f"{list(tokens.shape)}: expected [batch, beam] and [batch, beam, tokens]")
        texts = []
        for b, beam in np.ndindex(*lengths.shape):
            n = min(max(int(lengths[b, beam]), 0), tokens.shape[2])
            ids = tokens[b, beam, :n]
            if ((ids < 0) | (ids >= self.tokenizer.vocab_size)).any():
                raise UserError(f"TOKENS_BATCH: token id out of range [0, {self.tokenizer.vocab_size}) in batch "
                                f"item {b}, beam {beam}")
            texts.append(self.tokenizer.decode(ids, self.skip_special).encode("utf-8"))
        return pb_utils.Tensor("OUTPUT", np.array(texts, dtype=object))
