"""Reading and writing what lives on disk: orbax run checkpoints and policy folders
(`checkpoint`), Hugging Face folders (`hf`), GGUF files (`gguf`) and tokenizers (`tokenizer`)."""
