"""What ``transformers`` users need: a drop-in ``LogitsProcessor`` (``processor``), the embedded
model converted to a Hugging Face folder (``model_files``), and offline tokenizers (``tokenizers``)."""
