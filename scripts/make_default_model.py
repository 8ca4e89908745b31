"""Write the embedded default model: a tiny Kimi-Linear checkpoint with its own tokenizer.

    python scripts/make_default_model.py [--out trtllm_dasc/assets/tiny-kimi-linear]

The output is committed (`make run` serves it; nothing downloads) and must be reproducible: a test reruns
this script and compares every file but the weights byte for byte, the weights within a bf16 step (torch's
randn differs in its last bits between CPU kinds). So everything is seeded, the tokenizer corpus is
generated here (no file read), and only deterministic trainers are used.

- tokenizer: byte-level BPE (GPT-2 style), trained on an English-like corpus of passages and exam
  questions, so text workloads tokenize into word-sized pieces; byte-level so any UTF-8 text round-trips
  and streamed per-chunk decodes concatenate to the full text (a piece carries its own leading space).
  Ids 0-3 are <|pad|> <|bos|> <|eos|> <|unk|>; encoding prepends <|bos|> (tokenizer.json's post-processor,
  which transformers' AutoTokenizer and the `tokenizers` library both apply).
- model: KimiLinearForCausalLM (KDA + one MLA layer, MoE after the first layer) saved by transformers in
  bf16, except the decay and router tensors kept in fp32 as the released checkpoints keep them. The KDA
  decays follow the paper's profile (plan.synthetic), so a W_max=16 plan keeps some channels and omits most.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "trtllm_dasc", "assets", "tiny-kimi-linear")
SEED = 0
VOCAB_TARGET = 3072
SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|unk|>")
OUTPUT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json")

# an English-like lexicon: the words of reading-comprehension passages and the questions asked about them
FUNCTION = """the a an of to in on at by for with from about into over under after before during between
through and or but because although while if when where which who whom whose that this these those it its
they their them he his him she her we our you your i my is are was were be been being has have had do does
did will would can could should may might must not no nor so than then there here also only even just very
more most less least many much some any each every all both few other such same own what why how""".split()
NOUNS = """time year people way day man woman child world life hand part place case week company system
program question work government number night point home water room mother area money story fact month lot
right study book eye job word business issue side kind head house service friend father power hour game line
end member law car city community name president team minute idea kid body information back parent face
others level office door health person art war history party result change morning reason research girl guy
moment air teacher force education foot boy age policy music market sense nation plan college interest death
experience effect class control care field development role effort rate heart drug show leader light voice
wife police mind price report decision son view relationship town road arm difference value building action
model season society tax director position player record paper space ground form event official matter
center couple site project activity star table need court oil situation cost industry figure street image
phone data picture practice piece land product doctor wall patient worker news test movie north love support
technology step baby computer type attention film tree source organization hair window evidence population
site river island forest mountain village garden farmer scientist student author passage paragraph chapter
sentence theory energy planet ocean climate storm winter summer spring autumn animal bird fish plant seed
machine engine memory signal network library museum letter journey king queen army ship harbor bridge
castle merchant trade coin bread salt iron stone gold silver glass paper ink clock lamp fire smoke cloud
rain snow wind wave shore valley desert lake hill path map border century decade generation tradition
language culture religion science medicine disease cell gene brain muscle blood bone skin hospital nurse
experiment hypothesis conclusion argument claim detail example purpose tone attitude audience title
summary meaning contrast cause solution problem method process structure pattern feature advantage""".split()
VERBS = """say said get got make made go went know knew take took see saw come came think thought look looked
want give gave use used find found tell told ask asked seem seemed feel felt try tried leave left call called
keep kept let begin began help helped show showed hear heard play played run ran move moved live lived believe
bring brought happen happened write wrote provide sit stand stood lose lost pay paid meet met include
continue set learn learned lead led understand watch follow stop create speak read allow add spend grow open
walk win offer remember consider appear buy wait serve die send expect build stay fall cut reach kill remain
suggest suggests suggested raise pass sell require report decide pull explain explains explained describe
describes described argue argues argued support supports compare compares contrast discover discovered
develop developed produce produced protect protected travel traveled observe observed measure measured
improve improved increase increased reduce reduced prevent prevented answer answered choose chose mean means
indicate indicates imply implies infer conclude concludes illustrate illustrates mention mentions""".split()
ADJECTIVES = """good new first last long great little own other old right big high different small large
next early young important few public bad same able main certain clear recent strong possible whole free
military true federal international full special easy human local late hard major better economic best
likely real low political open difficult ancient modern northern southern eastern western quiet bright dark
warm cold heavy light rapid slow careful simple complex natural final central common rare primary
significant accurate correct incorrect valid reasonable surprising typical unusual""".split()
NAMES = """Maria John Aisha Chen Olga Pedro Fatima Kenji Amara Lucas Elena Omar Sofia David Priya Samuel
Lena Tom Grace Ivan""".split()
STEMS = ("Which of the following best describes {np}?", "According to the passage, why did {name} {verb} {np}?",
         "What is the main idea of paragraph {n}?", "The author mentions {np} in order to",
         "Which statement about {np} is supported by the passage?", "As used in line {n}, the word \"{adj}\" most "
         "nearly means", "What can be inferred about {np} from the passage?", "The primary purpose of the passage is to")


def _np(r: random.Random) -> str:
    det = r.choice(("the", "a", "this", "their", "every", "some", "his", "her"))
    return f"{det} {r.choice(ADJECTIVES)} {r.choice(NOUNS)}" if r.random() < 0.5 else f"{det} {r.choice(NOUNS)}"


def _sentence(r: random.Random) -> str:
    subject = r.choice(NAMES) if r.random() < 0.3 else _np(r)
    words = [subject, r.choice(VERBS), _np(r)]
    while r.random() < 0.6:
        words += [r.choice(FUNCTION), _np(r)]
    if r.random() < 0.2:
        words.append(f"in {r.randint(1500, 2030)}")
    text = " ".join(words)
    return text[0].upper() + text[1:] + r.choice(".....;!")


def corpus(seed: int = SEED, passages: int = 600) -> list[str]:
    """Passages followed by numbered multiple-choice questions, as the text workloads phrase them."""
    r, out = random.Random(seed), []
    for p in range(passages):
        lines = [f"Passage {p + 1}. Read the passage and answer the questions that follow."]
        lines += [" ".join(_sentence(r) for _ in range(r.randint(3, 6))) for _ in range(r.randint(2, 4))]
        for q in range(r.randint(2, 5)):
            stem = r.choice(STEMS).format(np=_np(r), name=r.choice(NAMES), verb=r.choice(VERBS),
                                          n=r.randint(1, 40), adj=r.choice(ADJECTIVES))
            lines.append(f"Question {q + 1}: {stem}")
            lines += [f"{c}) {_sentence(r)}" for c in "ABCD"]
            lines.append(f"Answer: {r.choice('ABCD')}")
        out.append("\n".join(lines))
    # every lexicon word on its own, capitalised and not, so none is left to single bytes
    out += [" ".join(w) for w in (FUNCTION, NOUNS, VERBS, ADJECTIVES, NAMES)]
    out += [" ".join(w.capitalize() for w in ws) for ws in (FUNCTION, NOUNS, VERBS, ADJECTIVES)]
    return out


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_TARGET):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", SPECIALS.index("<|bos|>"))])
    return tok


def write_tokenizer(tok, out_dir: str) -> None:
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    names = dict(zip(("pad_token", "bos_token", "eos_token", "unk_token"), SPECIALS))
    # model_max_length bounds nothing in our runtime; it only silences transformers' "very long" warning
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **names, "add_bos_token": True,
              "add_eos_token": False, "clean_up_tokenization_spaces": False, "model_max_length": 1 << 20}
    for name, obj in (("tokenizer_config.json", config), ("special_tokens_map.json", names)):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.write("\n")


def model_config(vocab_size: int):
    from transformers import KimiLinearConfig
    layer_types = ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 2
    return KimiLinearConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_hidden_layers=len(layer_types), layer_types=layer_types,
        mlp_layer_types=["dense"] + ["sparse"] * (len(layer_types) - 1),
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=16,
        qk_nope_head_dim=32, v_head_dim=32, linear_head_dim=32, linear_num_heads=4, linear_conv_kernel_dim=4,
        num_local_experts=4, num_experts_per_tok=2, n_shared_experts=1, max_position_embeddings=65536,
        # larger than the default 0.02 so logits are not all near zero (greedy text varies with the prompt)
        initializer_range=0.06, pad_token_id=0, bos_token_id=1, eos_token_id=2, dtype="bfloat16")


def build_model(vocab_size: int, seed: int = SEED):
    import torch
    from transformers import KimiLinearForCausalLM

    from trtllm_dasc.plan.synthetic import LEGACY_PROFILE, decay_tensors, synthetic_decay

    torch.manual_seed(seed)
    cfg = model_config(vocab_size)
    model = KimiLinearForCausalLM(cfg).float().eval()
    kda = [m for m in model.modules() if hasattr(m, "A_log") and hasattr(m, "dt_bias")]
    per_head = cfg.linear_head_dim
    # the committed model's decay (made before the profile's tails were fitted to the paper's capacities)
    alpha = synthetic_decay("kda", len(kda), cfg.linear_num_heads, per_head, seed, LEGACY_PROFILE)
    A_log, dt_bias = decay_tensors(alpha, per_head, seed)
    with torch.no_grad():
        for m, a, d in zip(kda, A_log, dt_bias):
            m.A_log.copy_(torch.tensor(a, dtype=torch.float32).view_as(m.A_log))
            m.dt_bias.copy_(torch.tensor(d, dtype=torch.float32).view_as(m.dt_bias))
    # bf16 like the released weights; decay and router tensors stay fp32 (the planner reads the former)
    keep = ("A_log", "dt_bias", "e_score_correction_bias", "gate.weight")
    for name, p in model.named_parameters():
        if not name.endswith(keep):
            p.data = p.data.to(torch.bfloat16)
    return model


def write_default_model(out_dir: str, seed: int = SEED) -> str:
    # replace a previous output, never a directory holding anything else (--out . must not wipe a checkout)
    if os.path.isdir(out_dir):
        foreign = sorted(set(os.listdir(out_dir)) - set(OUTPUT_FILES))
        if foreign:
            sys.exit(f"--out {out_dir} holds files this script does not write ({', '.join(foreign[:3])}); "
                     "choose an empty or new directory")
        for name in os.listdir(out_dir):
            os.remove(os.path.join(out_dir, name))
    os.makedirs(out_dir, exist_ok=True)
    tok = train_tokenizer(corpus(seed))
    model = build_model(tok.get_vocab_size(), seed)
    model.save_pretrained(out_dir)
    write_tokenizer(tok, out_dir)
    return out_dir


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=DEFAULT_OUT, help="output directory (replaced)")
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args(argv)
    out = write_default_model(args.out, args.seed)
    total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {out} ({total / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    sys.exit(main())
