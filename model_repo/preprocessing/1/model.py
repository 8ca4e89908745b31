"""preprocessing: prompt text -> token ids, stop/bad words -> TensorRT-LLM's [2, N] word lists, embedding-bias
words and weights -> a vocabulary-sized bias row.

Same I/O and semantics as TensorRT-LLM's preprocessing model (text inputs only): END_ID / PAD_ID default
to the tokenizer's EOS / PAD; a batch of prompts is right-padded with PAD to the longest; EMBEDDING_BIAS is
[batch, vocab] with each word's weight added at each of its tokens, or [batch, 0] unless both the words and
the weights are given. A bad request gets a Triton error naming the field; the other requests of the batch
are served.
"""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from trtllm_dasc.errors import UserError
from trtllm_dasc.serve.tokenizer import TextTokenizer, as_text, model_parameter, parse_bool


def _optional(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        tokenizer_dir = model_parameter(config, "tokenizer_dir")
        # relative to this model's directory: an engine directory (repository and model inside) can move
        self.tokenizer = TextTokenizer(os.path.join(args["model_repository"], tokenizer_dir))
        self.add_special_tokens = parse_bool(model_parameter(config, "add_special_tokens"), "add_special_tokens")

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._one(request)))
            except UserError as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
        return responses

    def _one(self, request):
        query = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()
        batch = query.shape[0]
        prompts = []
        for row in query:
            ids = self.tokenizer.encode(as_text(row.reshape(-1)[0], "QUERY (text_input)"), self.add_special_tokens)
            if not ids:
                raise UserError("QUERY (text_input): the prompt encodes to no tokens")
            prompts.append(ids)
        lengths = np.array([[len(ids)] for ids in prompts], dtype=np.int32)
        input_ids = np.full((batch, int(lengths.max())), self.tokenizer.pad_id, dtype=np.int32)
        for b, ids in enumerate(prompts):
            input_ids[b, :len(ids)] = ids
        end_id = _optional(request, "END_ID")
        pad_id = _optional(request, "PAD_ID")
        out = {
            "INPUT_ID": input_ids,
            "REQUEST_INPUT_LEN": lengths,
            "REQUEST_OUTPUT_LEN": pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy(),
            "BAD_WORDS_IDS": self.tokenizer.word_lists(_optional(request, "BAD_WORDS_DICT"), batch,
                                                       "BAD_WORDS_DICT (bad_words)"),
            "STOP_WORDS_IDS": self.tokenizer.word_lists(_optional(request, "STOP_WORDS_DICT"), batch,
                                                        "STOP_WORDS_DICT (stop_words)"),
            "OUT_END_ID": np.full((batch, 1), self.tokenizer.end_id, np.int32) if end_id is None else end_id,
            "OUT_PAD_ID": np.full((batch, 1), self.tokenizer.pad_id, np.int32) if pad_id is None else pad_id,
            # what TensorRT-LLM's preprocessing gives a decoder-only model (its clients forward them to
            # tensorrt_llm, which ignores them there): one pad token a request (DECODER_INPUT_ID, below), length 1
            "REQUEST_DECODER_INPUT_LEN": np.ones((batch, 1), np.int32),
        }
        out["DECODER_INPUT_ID"] = np.broadcast_to(np.asarray(out["OUT_PAD_ID"]).reshape(-1, 1), (batch, 1))
        tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value, dtype=np.int32)) for name, value in out.items()]
        bias = self._embedding_bias(_optional(request, "EMBEDDING_BIAS_WORDS"),
                                    _optional(request, "EMBEDDING_BIAS_WEIGHTS"), batch)
        return tensors + [pb_utils.Tensor("EMBEDDING_BIAS", bias)]

    def _embedding_bias(self, words, weights, batch: int) -> np.ndarray:
        """TensorRT-LLM's rule (its preprocessing _get_embedding_bias): [batch, 0] unless both are given, else
        per request a vocabulary row with each word's weight added at each token of the word. Words are
        encoded as stop / bad words are, without special tokens (TensorRT-LLM's adds them too, so a BOS
        tokenizer biased its BOS with every word); a word that encodes to nothing adds nothing."""
        if words is None or weights is None:
            return np.zeros((batch, 0), np.float32)
        if words.shape[0] != batch or weights.shape[0] != batch:
            raise UserError(f"EMBEDDING_BIAS_WORDS / _WEIGHTS: a row for each of the {batch} prompts, got "
                            f"{words.shape[0]} and {weights.shape[0]}")
        # a row of the model's vocabulary, which the engine requires (TensorRT-LLM's check); the tokenizer's
        # count differs where the LM head is padded past it
        width = self.tokenizer.model_vocab_size
        bias = np.zeros((batch, width), np.float32)
        for b in range(batch):
            row_words, row_weights = words[b].reshape(-1), weights[b].reshape(-1).astype(np.float32)
            if row_words.size != row_weights.size:
                raise UserError(f"EMBEDDING_BIAS_WORDS ({row_words.size}) and EMBEDDING_BIAS_WEIGHTS "
                                f"({row_weights.size}) must have the same length")
            if not np.isfinite(row_weights).all():
                raise UserError("EMBEDDING_BIAS_WEIGHTS must be finite")
            for word, weight in zip(row_words, row_weights):
                for token in self.tokenizer.encode(as_text(word, "EMBEDDING_BIAS_WORDS"), False):
                    if not 0 <= token < width:
                        raise UserError(f"EMBEDDING_BIAS_WORDS: a word encodes to token {token}, outside the "
                                        f"model's vocabulary of {width}")
                    bias[b, token] += weight
        return bias
