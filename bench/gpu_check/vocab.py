"""A WordPiece tokenizer laid out like BERT's Chinese vocabulary (BGE-zh's), written without a model hub.

Served texts go through `bge_tokenizer`, which needs a `tokenizer.json`. BGE-zh's vocabulary puts [PAD] at 0,
[UNK] [CLS] [SEP] [MASK] at 100-103 and then mostly single Chinese characters, so a Chinese text costs one token
a character, as here. The English words of the bench's texts (bench/workload.py) are whole tokens here, where the
real vocabulary splits some of them into two or three pieces: English texts come out a little shorter.
"""

from __future__ import annotations

import string
from pathlib import Path

from bench import workload

SPECIALS = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]"}
CJK_FIRST, CJK_LAST = 0x4E00, 0x9FFF
# CJK punctuation and full-width forms (the ideographic comma and full stop, ...), which Chinese texts use and the
# real vocabulary holds.
CJK_PUNCTUATION = [*range(0x3000, 0x3040), *range(0xFF01, 0xFF5F)]


def vocabulary(size: int) -> list[str]:
    """`size` tokens: specials and unused slots, ASCII characters and pieces, English words, CJK punctuation and
    characters."""
    tokens = [SPECIALS.get(index, f"[unused{index}]") for index in range(104)]
    tokens += list(string.punctuation + string.digits + string.ascii_lowercase)
    tokens += [f"##{c}" for c in string.digits + string.ascii_lowercase]
    words = {w for group in _english_words() for phrase in group for w in phrase.lower().split()}
    tokens += sorted(words - set(tokens))
    tokens += [chr(code) for code in CJK_PUNCTUATION]
    tokens += [chr(code) for code in range(CJK_FIRST, CJK_LAST + 1)][: max(0, size - len(tokens))]
    if len(tokens) != size:
        raise ValueError(f"a vocabulary of {size} tokens cannot hold the {len(tokens)} this layout needs")
    return tokens


def _english_words() -> tuple[tuple[str, ...], ...]:
    return (
        workload.EN_DETERMINERS,
        workload.EN_ADJECTIVES,
        workload.EN_NOUNS,
        workload.EN_VERBS,
        workload.EN_ADVERBS,
        workload.EN_PREPOSITIONS,
        workload.EN_CONNECTORS,
    )


def write_tokenizer(path: Path, size: int) -> Path:
    """A BERT-style fast tokenizer (lower-casing, CJK characters split, [CLS] ... [SEP]) of `size` tokens."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {token: index for index, token in enumerate(vocabulary(size))}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 101), ("[SEP]", 102)]
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.save(str(path))
    return path
