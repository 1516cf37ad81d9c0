"""Tiny random-weight decision GGUFs of the types that need more than a llama model's label logits:
kev (qwen35 with its cls.output pointer projection), laya (modern-bert with its decision blocks),
clef (qwen35 with the joint head), lfm2-d1 (causal lfm2) and lfm2-d1-omni (bidirectional lfm2 with
the decision blocks). Each has its type's real tensors and metadata, as llama.cpp's loaders require
them (src/models/*.cpp of the engine's llama.cpp), and its converter's systemone template
(conversion/*.py there). Their answers mean nothing: tests compare onepass with llama-server on them.

Shapes are ggml's {ne0, ne1}, which numpy writes as (ne1, ne0).
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from itertools import product
from pathlib import Path

import gguf
import numpy as np

from app.platform.tiny_gguf import spm_vocabulary

E, FF, NH, NKV, HD = 64, 128, 4, 2, 16  # n_embd, n_ff, n_head, n_head_kv, head dim (E // NH)


def str_or_json(name: str) -> str:
    """A template expression printing a value as is when it is a string, else as JSON (conversion/base.py)."""
    return "{{ " + name + " if " + name + " is string else " + name + " | tojson }}"


def vocabulary(controls: list[str]) -> tuple[list[str], list[int]]:
    letters = string.ascii_uppercase
    pieces = [c for c in string.printable[:95] if c != " "] + ["▁", "\n"]
    pieces += ["Yes", "No", "YES", "NO", "yes", "no", "▁yes", "▁no", "▁Yes", "▁No"]
    pieces += [f"▁{c}" for c in letters + string.ascii_lowercase + string.digits]
    pieces += ["".join(p) for p in product(letters, repeat=2)]
    pieces += [f"{i:02d}" for i in range(100)]
    return spm_vocabulary(controls, pieces)


class Tiny:
    def __init__(self, path: Path, arch: str, kind: str, controls: list[str], template: str, seed: int = 7) -> None:
        self.rng = np.random.default_rng(seed)
        self.tokens, types = vocabulary(controls)
        self.n_vocab = len(self.tokens)
        self.w = gguf.GGUFWriter(str(path), arch)
        self.arch = arch
        w = self.w
        w.add_name(f"tiny-{kind}")
        w.add_context_length(4096)
        w.add_embedding_length(E)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_tokenizer_model("llama")
        w.add_token_list(self.tokens)
        w.add_token_scores([-float(i) for i in range(self.n_vocab)])
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(False)  # the server tokenizes prompts with add_special=false anyway
        w.add_add_space_prefix(False)
        w.add_chat_template([{"name": "systemone", "template": template}])
        w.add_string(f"{arch}.decision.type", kind)  # common/common.cpp:1186-1196
        for name, t in {"choice": 1.5, "score": 2.0, "noul": 0.8, "choice.3_5": 1.2}.items():
            w.add_float32(f"{arch}.decision.temperature.{name}", t)  # server-decision.cpp:52-67

    def id(self, text: str) -> int:
        return self.tokens.index(text)

    def t(self, name: str, *ggml_shape: int, scale: float = 0.15, ones: bool = False) -> None:
        shape = tuple(reversed(ggml_shape))  # ggml {ne0, ne1} -> numpy (ne1, ne0)
        data = np.ones(shape, np.float32) if ones else (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.w.add_tensor(name, data)

    def close(self) -> None:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


# --- qwen35 trunk (kev, clef): NEW src/models/qwen35.cpp:4-128 -------------------------------------------
SSM_STATE, SSM_GROUPS, SSM_DT_RANK, SSM_CONV = 16, 2, 4, 4
KEY_DIM, VALUE_DIM = SSM_STATE * SSM_GROUPS, SSM_STATE * SSM_DT_RANK  # 32, 64


def qwen35_trunk(m: Tiny, with_output: bool = True) -> None:
    w = m.w
    w.add_block_count(2)
    w.add_feed_forward_length(FF)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_dimension_count(HD)
    w.add_rope_dimension_sections([3, 3, 2, 0])  # required (qwen35.cpp:6), sum = n_rot / 2 (IMROPE)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)  # required (qwen35.cpp:5)
    w.add_ssm_conv_kernel(SSM_CONV)  # qwen35.cpp:9-13, all required
    w.add_ssm_inner_size(VALUE_DIM)  # = state_size * time_step_rank (graph: head_v_dim = d_inner / dt_rank)
    w.add_ssm_state_size(SSM_STATE)
    w.add_ssm_time_step_rank(SSM_DT_RANK)
    w.add_ssm_group_count(SSM_GROUPS)
    w.add_full_attention_interval(2)  # layer 0 linear attention, layer 1 full attention (qwen35.cpp:17-23)
    m.t("token_embd.weight", E, m.n_vocab, scale=1.0)
    m.t("output_norm.weight", E, ones=True)
    if with_output:
        m.t("output.weight", E, m.n_vocab, scale=0.5)  # optional: else token_embd is used (qwen35.cpp:44-53)
    for il in range(2):
        m.t(f"blk.{il}.attn_norm.weight", E, ones=True)
        m.t(f"blk.{il}.post_attention_norm.weight", E, ones=True)
        if il == 0:  # recurrent (gated delta net), qwen35.cpp:79-89
            m.t(f"blk.{il}.attn_qkv.weight", E, 2 * KEY_DIM + VALUE_DIM)
            m.t(f"blk.{il}.attn_gate.weight", E, VALUE_DIM)
            m.t(f"blk.{il}.ssm_conv1d.weight", SSM_CONV, 2 * KEY_DIM + VALUE_DIM)
            m.t(f"blk.{il}.ssm_dt.bias", SSM_DT_RANK)
            m.w.add_tensor(f"blk.{il}.ssm_a", -np.exp(m.rng.standard_normal(SSM_DT_RANK) * 0.1).astype(np.float32))
            m.t(f"blk.{il}.ssm_beta.weight", E, SSM_DT_RANK)
            m.t(f"blk.{il}.ssm_alpha.weight", E, SSM_DT_RANK)
            m.t(f"blk.{il}.ssm_norm.weight", SSM_STATE, ones=True)
            m.t(f"blk.{il}.ssm_out.weight", VALUE_DIM, E)
        else:  # full attention: Q carries query + gate (qwen35.cpp:70-77)
            m.t(f"blk.{il}.attn_q.weight", E, HD * NH * 2)
            m.t(f"blk.{il}.attn_k.weight", E, HD * NKV)
            m.t(f"blk.{il}.attn_v.weight", E, HD * NKV)
            m.t(f"blk.{il}.attn_output.weight", HD * NH, E)
            m.t(f"blk.{il}.attn_q_norm.weight", HD, ones=True)
            m.t(f"blk.{il}.attn_k_norm.weight", HD, ones=True)
        m.t(f"blk.{il}.ffn_gate.weight", E, FF)
        m.t(f"blk.{il}.ffn_up.weight", E, FF)
        m.t(f"blk.{il}.ffn_down.weight", FF, E)


KEV_TEMPLATE = (  # conversion/lev.py:181-194
    "<|fim_prefix|>{{ state }}<|fim_middle|>{{ instructions }}"
    "{% for o in options %}<|box_start|>"
    "{% if type == 'score' %}{% if o.description %}{{ o.description }}{% endif %}"
    "{% else %}{% if type != 'noul' %}{{ o.key }}{% elif o.key == 'true' %}yes{% else %}no{% endif %}"
    "{% if o.description %}: {{ o.description }}{% endif %}{% endif %}"
    "<|box_end|>{% endfor %}<|fim_suffix|>"
)


def kev(path: Path) -> Path:
    m = Tiny(
        path,
        "qwen35",
        "kev",
        ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|box_start|>", "<|box_end|>"],
        KEV_TEMPLATE,
    )
    qwen35_trunk(m)
    n_out = 2 * 8  # [q | k], pointer head dim 8
    m.w.add_embedding_length_out(n_out)  # qwen35.embedding_length_out (llama-model.cpp:1345)
    m.t("cls.output.weight", E, n_out)  # optional for qwen35; present = kev's pointer projection (qwen35.cpp:47-48)
    m.t("cls.output.bias", n_out)
    m.close()
    return path


# --- clef: qwen35 trunk + joint head, NEW src/models/clef.cpp:7-98 --------------------------------------
EH, FFH, R, J = 32, 64, 1, 1  # head width, head ffn, routing blocks, joint blocks


def clef_template() -> str:  # conversion/clef.py:57-96
    system = (
        "Read the complete state and schema. Decide every field jointly. Each answer must be"
        " exactly one of that field's allowed options."
    )

    def text(value: str) -> str:
        return "{{ " + json.dumps(value) + " }}"

    def render(name: str) -> str:
        return "{{ " + name + " if " + name + " is string else " + name + " | tojson(separators=[',', ':']) }}"

    option = (
        "{% set d = o.description %}{% if q.type == 'noul' and d is none %}"
        "{% set d = 'The proposition is true or the answer is yes.' if o.key == 'true' else 'The"
        " proposition is false or the answer is no.' %}"
        "{% endif %}{{ ({'option_id': o.key} if d is none else {'description': d, 'option_id':"
        " o.key}) | tojson(separators=[',', ':']) }}"
    )
    return (
        text(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nSTATE:\n")
        + "{% if images %}{{ sep }}{% for image in images %}{{ image }}{% endfor %}"
        + text("\n")
        + "{% endif %}"
        + "{{ sep }}"
        + render("state")
        + "{{ sep }}"
        + text("\n\nSCHEMA FIELDS:\n")
        + "{% for q in questions %}{{ sep }}"
        + text("\nFIELD ")
        + "{{ loop.index }}"
        + text("\nID: ")
        + "{{ q.id }}"
        + text("\nTYPE: ")
        + "{{ q.type }}"
        + text("\nINSTRUCTION: ")
        + "{{ sep }}{{ mark_question }}"
        + render("q.instructions")
        + "{{ sep }}"
        + text("\nALLOWED OPTIONS:\n")
        + "{% for o in q.options %}{{ sep }}"
        + text("OPTION ")
        + "{{ loop.index }}"
        + text(": ")
        + "{{ sep }}{{ mark_option }}"
        + option
        + "{{ sep }}"
        + text("\n")
        + "{% endfor %}"
        + "{{ sep }}"
        + text("END FIELD\n")
        + "{% endfor %}"
        + "{{ sep }}"
        + text("\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:")
    )


def clef(path: Path, sharpness: float = 1.0) -> Path:
    """`sharpness`: how far apart its scores lie (the scorer's output weights' scale, times 0.15)."""
    m = Tiny(path, "clef", "clef", ["<|im_start|>", "<|im_end|>", "<think>", "</think>"], clef_template())
    qwen35_trunk(m)  # same keys under "clef." (clef.cpp:8 calls qwen35's loader)
    w = m.w
    w.add_uint32("clef.decision.routing_block_count", R)  # clef.cpp:10-12, required
    w.add_uint32("clef.decision.block_count", J)
    w.add_uint32("clef.decision.head_count", 2)  # EH % head_count == 0 (clef.cpp:38)
    w.add_layer_norm_eps(1e-5)  # clef.attention.layer_norm_epsilon, required (clef.cpp:19)

    def norm(name: str, n: int) -> None:
        m.t(f"{name}.weight", n, ones=True)
        m.t(f"{name}.bias", n, scale=0.0)

    def attn(prefix: str) -> None:
        for x in "qkvo":
            m.t(f"{prefix}_{x}.weight", EH, EH)
            m.t(f"{prefix}_{x}.bias", EH)

    for il in range(R + J):  # routing blocks first (clef.cpp:58-77)
        if il < R:
            norm(f"dec.blk.{il}.cross_attn_norm_kv", EH)
        else:
            norm(f"dec.blk.{il}.attn_norm", EH)
            attn(f"dec.blk.{il}.attn")
        norm(f"dec.blk.{il}.cross_attn_norm", EH)
        attn(f"dec.blk.{il}.cross_attn")
        norm(f"dec.blk.{il}.ffn_norm", EH)
        m.t(f"dec.blk.{il}.ffn_up.weight", EH, FFH)
        m.t(f"dec.blk.{il}.ffn_up.bias", FFH)
        m.t(f"dec.blk.{il}.ffn_down.weight", FFH, EH)
        m.t(f"dec.blk.{il}.ffn_down.bias", EH)
    norm("decision.hidden_norm", E)
    for name in ("option_summary_norm", "field_norm", "option_norm"):
        norm(f"decision.{name}", EH)
    for name in ("memory", "question", "option_question", "global", "option_context", "option_lexical"):
        m.t(f"decision.proj_{name}.weight", E, EH)
    w.add_tensor("decision.scales", np.array([1.0, 2.0, 0.5], np.float32))  # prior, joint, residual gate
    m.t("token_types.weight", EH, 3)
    m.t("decision.scorer.weight", 4 * EH, EH)
    m.t("decision.scorer.bias", EH)
    m.t("decision.scorer_out.weight", EH, 1, scale=0.15 * sharpness)
    m.t("decision.scorer_out.bias", 1)
    m.close()
    return path


def head_blocks(m: Tiny, layers: range, ff: int) -> None:
    """The decision head's blocks that laya and lfm2-d1-omni share: every weight with its bias."""
    for i in layers:
        for n in ("attn_norm", "ffn_norm"):
            m.t(f"blk.{i}.{n}.weight", E, ones=True)
            m.t(f"blk.{i}.{n}.bias", E, scale=0.0)
        m.t(f"blk.{i}.attn_qkv.weight", E, 3 * E)
        m.t(f"blk.{i}.attn_qkv.bias", 3 * E)
        m.t(f"blk.{i}.attn_output.weight", E, E)
        m.t(f"blk.{i}.attn_output.bias", E)
        m.t(f"blk.{i}.ffn_up.weight", E, ff)
        m.t(f"blk.{i}.ffn_up.bias", ff)
        m.t(f"blk.{i}.ffn_down.weight", ff, E)
        m.t(f"blk.{i}.ffn_down.bias", E)


# --- laya: modern-bert encoder + decision blocks, NEW src/models/modern-bert.cpp:6-132 ---------------------
def laya(path: Path) -> Path:
    cls_, sep, mask = "[CLS]", "[SEP]", "[MASK]"
    option = (  # conversion/bert.py:700-707 (laya, not Julia)
        "{% if type == 'choice' %}{{ o.key }}{% if o.description %}: " + str_or_json("o.description") + "{% endif %}"
        "{% elif type == 'score' %}level {{ o.key }}: "
        + str_or_json("o.description")
        + "{% else %}{{ o.key }}: {% if o.description %}"
        + str_or_json("o.description")
        + "{% elif o.key == 'true' %}yes, the statement holds{% else %}no, the statement does not"
        " hold{% endif %}{% endif %}"
    )
    template = (  # conversion/bert.py:708-712
        cls_
        + "{{ type }} question: "
        + str_or_json("instructions")
        + sep
        + "{% for o in options %}"
        + mask
        + " "
        + option
        + "{% endfor %}"
        + sep
        + str_or_json("state")
        + sep
    )
    m = Tiny(path, "modern-bert", "laya", [cls_, sep, mask], template)
    w = m.w
    n_enc, n_dec, ff_head = 2, 1, 4 * E
    w.add_block_count(n_enc + n_dec)
    w.add_feed_forward_length([FF] * n_enc + [ff_head] * n_dec)  # per layer: the head's n_ff(i)
    w.add_head_count(NH)
    w.add_layer_norm_eps(1e-5)  # required (modern-bert.cpp:16)
    w.add_causal_attention(False)
    w.add_rope_freq_base(160000.0)
    w.add_token_type_count(3)  # required == 3 (modern-bert.cpp:120)
    w.add_uint32("modern-bert.decision.block_count", n_dec)  # modern-bert.cpp:37
    w.add_uint32("modern-bert.decision.max_head_tokens", 64)  # server-decision.cpp:116-120, must be > 0
    w.add_uint32("tokenizer.ggml.seperator_token_id", m.id(sep))  # llama_vocab_sep (sic: "seperator")
    w.add_mask_token_id(m.id(mask))
    w.add_uint32("tokenizer.ggml.cls_token_id", m.id(cls_))
    m.t("token_embd.weight", E, m.n_vocab, scale=1.0)
    m.t("token_embd_norm.weight", E, ones=True)
    m.t("output_norm.weight", E, ones=True)
    for i in range(n_enc):  # modern-bert.cpp:71-88 (GEGLU: ffn_up is 2*n_ff wide)
        m.t(f"blk.{i}.attn_norm.weight", E, ones=True)  # optional for i == 0
        m.t(f"blk.{i}.attn_qkv.weight", E, 3 * E)
        m.t(f"blk.{i}.attn_output.weight", E, E)
        m.t(f"blk.{i}.ffn_up.weight", E, 2 * FF)
        m.t(f"blk.{i}.ffn_down.weight", FF, E)
        m.t(f"blk.{i}.ffn_norm.weight", E, ones=True)
    head_blocks(m, range(n_enc, n_enc + n_dec), ff_head)  # modern-bert.cpp:100-118
    m.t("token_types.weight", E, 3)
    m.t("cls.weight", E, E)
    m.t("cls.bias", E)
    m.t("cls.norm.weight", E, ones=True)
    m.t("cls.norm.bias", E, scale=0.0)
    m.t("cls.output.weight", E, 1)  # n_cls_out = 1 (no classifier.output_labels key)
    m.t("cls.output.bias", 1)
    m.close()
    return path


# --- lfm2 trunk (lfm2-d1 causal, lfm2-d1-omni bidirectional + head): NEW src/models/lfm2.cpp:10-135 ------
def lfm2_trunk(m: Tiny, n_trunk: int) -> None:
    for i in range(n_trunk):  # layer 0: short conv (head_count_kv 0), layer 1: attention
        m.t(f"blk.{i}.ffn_norm.weight", E, ones=True)
        m.t(f"blk.{i}.ffn_gate.weight", E, FF)
        m.t(f"blk.{i}.ffn_up.weight", E, FF)
        m.t(f"blk.{i}.ffn_down.weight", FF, E)
        m.t(f"blk.{i}.attn_norm.weight", E, ones=True)
        if i == 0:
            m.t(f"blk.{i}.shortconv.conv.weight", 3, E)  # l_cache = 3 (the d1-omni graph asserts 3)
            m.t(f"blk.{i}.shortconv.in_proj.weight", E, 3 * E)
            m.t(f"blk.{i}.shortconv.out_proj.weight", E, E)
        else:
            m.t(f"blk.{i}.attn_q_norm.weight", HD, ones=True)
            m.t(f"blk.{i}.attn_k_norm.weight", HD, ones=True)
            m.t(f"blk.{i}.attn_q.weight", E, E)
            m.t(f"blk.{i}.attn_k.weight", E, HD * NKV)
            m.t(f"blk.{i}.attn_v.weight", E, HD * NKV)
            m.t(f"blk.{i}.attn_output.weight", E, E)


def lfm2_keys(m: Tiny, n_layer: int, head_kv: list[int], ffs: list[int] | int) -> None:
    w = m.w
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ffs)
    w.add_head_count(NH)
    w.add_head_count_kv(head_kv)  # per layer; 0 marks a short-conv layer (lfm2.cpp:14-16)
    w.add_shortconv_l_cache(3)  # required (lfm2.cpp:11)
    w.add_layer_norm_rms_eps(1e-5)  # required (lfm2.cpp:12)
    w.add_rope_freq_base(1e6)


def d1_template() -> str:  # conversion/lfm2.py:95-125
    description = str_or_json("o.description")
    choice = (
        "{{ '\\n\\nOptions:\\n' }}{% for o in options %}{{ o.label }} {% if o.description %}"
        + description
        + "{% else %}{{ o.key | replace('_', ' ') }}{% endif %}{% if not loop.last %}{{ '\\n' }}{% endif %}{% endfor %}"
        "{{ '\\n\\nReply with the option code only.' }}"
    )
    noul = (
        "{% set ns = namespace(criteria=false) %}{% for o in options %}{% if o.description is not"
        " none %}{% set ns.criteria = true %}{% endif %}{% endfor %}"
        "{% if ns.criteria %}{% for o in options %}{{ '\\nYes: ' if o.key == 'true' else '\\nNo: ' }}"
        "{% if o.description is none %}None{% else %}" + description + "{% endif %}{% endfor %}{% endif %}"
        "{{ '\\n\\nReply with yes or no only.' }}"
    )
    score = (
        "{{ '\\n\\n' }}{% for o in options %}{{ o.key }} " + description + "{{ '\\n' }}{% endfor %}"
        "{{ '\\nReply with a single digit 0-' }}{{ options | length - 1 }}{{ ' only.' }}"
    )
    return (
        "<|startoftext|><|im_start|>user\n{% for image in images %}{{ image }}{% endfor %}"
        "{% if state is not none %}{% if state is string %}{{ state }}{% else %}{{ state |"
        " tojson(indent=2) }}{% endif %}"
        "{{ '\\n\\n\\nQUESTION:\\n' }}{% endif %}"
        + str_or_json("instructions")
        + "{% if type == 'choice' %}"
        + choice
        + "{% elif type == 'noul' %}"
        + noul
        + "{% else %}"
        + score
        + "{% endif %}"
        "{{ '<|im_end|>\\n<|im_start|>assistant\\n' }}"
    )


def lfm2_d1(path: Path) -> Path:
    m = Tiny(path, "lfm2", "lfm2-d1", ["<|startoftext|>", "<|im_start|>", "<|im_end|>"], d1_template())
    lfm2_keys(m, 2, [0, NKV], FF)
    m.t("token_embd.weight", E, m.n_vocab, scale=1.0)
    m.t("token_embd_norm.weight", E, ones=True)  # LLM_TENSOR_OUTPUT_NORM_LFM2 (llama-arch.cpp:452)
    m.t("output.weight", E, m.n_vocab, scale=0.5)  # optional (lfm2.cpp:87-91)
    lfm2_trunk(m, 2)
    m.close()
    return path


def d1_omni_template() -> str:  # conversion/lfm2.py:205-234
    description = str_or_json("o.description")
    has_description = "o.description is not none and o.description != ''"
    yes_no = "{{ 'yes' if o.key == 'true' else 'no' }}"
    option_code = "{% if loop.index0 < 10 %}00{% elif loop.index0 < 100 %}0{% endif %}{{ loop.index0 }}"
    option = (
        "{% if type == 'choice' and audio %}option_" + option_code + ": "
        "{% if " + has_description + " %}" + description + "{% else %}{{ o.key }}{% endif %}"
        "{% elif type == 'choice' %}{{ o.key }}{% if " + has_description + " %}: " + description + "{% endif %}"
        "{% elif type == 'score' %}level {{ o.key }}: "
        + description
        + "{% elif audio %}{{ o.key }}: "
        + yes_no
        + "{% else %}{{ o.key }}: {% if "
        + has_description
        + " %}"
        + description
        + "{% elif images and not ns.criteria %}"
        + yes_no
        + "{% elif o.key == 'true' %}yes, the statement holds{% else %}no, the statement does not"
        " hold{% endif %}{% endif %}"
    )
    state = (
        "{% if state is string %}{{ state }}{% elif state is not none %}{{ state | tojson }}{%"
        " elif audio %}{}{% endif %}"
    )
    return (
        "{% set ns = namespace(criteria=false) %}"
        "{% for o in options %}{% if o.description is not none %}{% set ns.criteria = true %}{% endif %}{% endfor %}"
        "{% for image in images %}{{ image }}{% endfor %}{{ sep }}"
        "<|startoftext|><|reserved_7|>{{ sep }}{{ mark_state }}"
        + state
        + "{{ sep }}{{ mark_question }}<|reserved_8|>"
        + str_or_json("instructions")
        + "{% for o in options %}{{ sep }}<|reserved_9|><|mask|>{{ sep }}{{ mark_option }} "
        + option
        + "{{ sep }}<|reserved_10|>{% endfor %}{{ sep }}<|reserved_11|>"
    )


def lfm2_d1_omni(path: Path) -> Path:
    controls = ["<|startoftext|>", "<|mask|>"] + [f"<|reserved_{i}|>" for i in range(7, 12)]
    m = Tiny(path, "lfm2", "lfm2-d1-omni", controls, d1_omni_template())
    n_trunk, n_dec, ff_head = 2, 1, 4 * E
    lfm2_keys(m, n_trunk + n_dec, [0, NKV] + [NH] * n_dec, [FF] * n_trunk + [ff_head] * n_dec)
    w = m.w
    w.add_causal_attention(False)  # required false with decision blocks (lfm2.cpp:31)
    w.add_layer_norm_eps(1e-5)  # required with decision blocks (lfm2.cpp:34)
    w.add_uint32("lfm2.decision.block_count", n_dec)
    w.add_token_type_count(3)
    w.add_mask_token_id(m.id("<|mask|>"))
    m.t("token_embd.weight", E, m.n_vocab, scale=1.0)
    m.t("token_embd_norm.weight", E, ones=True)
    # no output.weight: the decision branch does not create it (lfm2.cpp:53-92)
    lfm2_trunk(m, n_trunk)
    head_blocks(m, range(n_trunk, n_trunk + n_dec), ff_head)  # lfm2.cpp:55-73
    m.t("token_types.weight", E, 3)
    m.t("cls.norm.weight", E, ones=True)
    m.t("cls.norm.bias", E, scale=0.0)
    m.t("cls.weight", E, E)
    m.t("cls.bias", E)
    m.t("cls.output.weight", E, 1)
    m.t("cls.output.bias", 1)
    m.close()
    return path


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "kev": kev,
    "clef": clef,
    "laya": laya,
    "lfm2-d1": lfm2_d1,
    "lfm2-d1-omni": lfm2_d1_omni,
}
