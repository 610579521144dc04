"""Reading and writing what lives on disk: orbax run checkpoints (`run_checkpoint`), policy
folders (`policy_folder`), Hugging Face folders (`hf`), GGUF files (`gguf`) and tokenizers
(`tokenizer`)."""
