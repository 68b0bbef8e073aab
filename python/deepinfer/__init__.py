"""DeepInfer: offline LLM inference from Python, shaped like vLLM's API.

    from deepinfer import LLM, SamplingParams
    llm = LLM()  # the built-in default model; LLM(model="path/to/model.gguf" or an HF folder)
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16))
    print(out[0].outputs[0].text)
"""
from ._core import ParamError
from ._core import set_log_level
from .llm import LLM, Tokenizer
from .outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from .sampling_params import SamplingParams, StructuredOutputsParams

__all__ = [
    "LLM",
    "SamplingParams",
    "StructuredOutputsParams",
    "RequestOutput",
    "CompletionOutput",
    "RequestMetrics",
    "Logprob",
    "Tokenizer",
    "ParamError",
    "set_log_level",
]
__version__ = "0.2.0"
