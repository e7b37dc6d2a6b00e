"""Build a tiny random-weight vision chat model, fully offline, for the live media tier.

    HF_HUB_OFFLINE=1 /tmp/real-vllm/venv/bin/python deploy/live/make_tiny_vlm.py OUT_DIR

Model class: ``Idefics3ForConditionalGeneration`` (an Idefics3/SigLIP-style vision tower,
a pixel-shuffle connector, a Llama language model; SmolVLM's family). Why Idefics3: vLLM
0.32.0's CPU build runs without torchvision (../shared/tools/real-vllm/setup.sh removes
the index's torchvision, which breaks vLLM's imports), and there LLaVA, Qwen2-VL and
Gemma 3 fail to import, and PaliGemma imports but fails at start while profiling
(``vision.get_vision_encoder_info`` imports ``pixtral``, which imports transformers'
torchvision image processor: ``No module named 'torchvision'``). Idefics3's path touches
neither, and transformers 5's ``Idefics3ImageProcessorPil`` needs only PIL. With image
splitting off, each image is one 224x224 tile: (224 / 14) ** 2 / 2 ** 2 = 64 ``<image>``
tokens, plus three around them, in vLLM's prompt.

The tokenizer is trained here (byte-level BPE, as ../shared/tools/real-vllm builds its tiny
Llama) with Idefics3's special tokens; the chat template takes string content, so vLLM puts
the ``<image>`` placeholder in the text. The weights are noise: what it writes is noise.
"""

from __future__ import annotations

import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    Idefics3Config,
    Idefics3ForConditionalGeneration,
    Idefics3ImageProcessorPil,
    Idefics3Processor,
    Idefics3VisionConfig,
    LlamaConfig,
    PreTrainedTokenizerFast,
)

IMAGE_SIZE, PATCH, SCALE = 224, 14, 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH) ** 2 // SCALE ** 2
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role']=='user' %}<|user|>{% elif m['role']=='system' %}"
    "<|system|>{% else %}<|assistant|>{% endif %}"
    "{{ m['content'] if m['content'] is string else '' }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    corpus = ["Hello world, this is a tiny test model for a gateway.",
              "Describe the image in one short sentence.",
              "The weather in Paris is sunny today."] * 50
    specials = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>",
                "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=512, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    image_processor = Idefics3ImageProcessorPil(
        size={"longest_edge": IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE},
        do_image_splitting=False)
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                                  image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(out)
    tokenizer = processor.tokenizer
    tokenizer.save_pretrained(out)
    vision = Idefics3VisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, image_size=IMAGE_SIZE,
                                  patch_size=PATCH)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=1024, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    config = Idefics3Config(vision_config=vision.to_dict(), text_config=text.to_dict(),
                            image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                            scale_factor=SCALE, tie_word_embeddings=True,
                            pad_token_id=tokenizer.pad_token_id,
                            torch_dtype="float32")
    torch.manual_seed(0)
    model = Idefics3ForConditionalGeneration(config)
    model.save_pretrained(out, safe_serialization=True)
    print("saved", out, "vocab", len(tokenizer), "image token", config.image_token_id,
          "image tokens per image", IMAGE_SEQ_LEN,
          "params", sum(p.numel() for p in model.parameters()))


if __name__ == "__main__":
    main(sys.argv[1])
