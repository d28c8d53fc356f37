"""What makes two chat requests comparable: the question (the last user text) and its context.

Two requests share a *context* when everything but the last user message's text is
identical (model, sampling parameters, thinking switch, every earlier turn but its reasoning;
delivery fields aside), so a multi-turn conversation only matches when all its earlier turns
match; and when that text has the same numbers in the same order: "what is 12345 * 6789?" and "... 6788?" are
near-identical texts and different questions; and the same polarity, so "how do I enable X?"
never answers "how do I not enable X?" (`query_negated`).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from gateway.cache.chat import DELIVERY_FIELDS

# What an assistant turn may carry besides its answer: its reasoning, which TokenHub asks to be passed back in
# tool-calling turns. The thinking switch and the effort (request fields) stay in the context.
REASONING_FIELDS = frozenset({"reasoning_content"})
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_THOUSANDS = re.compile(r",(?=\d{3}(?!\d))")  # "1,500" is 1500; "1,2" (a list, or a decimal comma) is not 12
# Polarity is the parity of negations: "not X" matches "never X", and "不得不" (must) is not negated. "nor" only
# continues a negation already counted ("neither A nor B"), so it is none; "not only", "no matter" and "No. 2"
# are no negation either.
_EN_NEGATION = re.compile(
    r"\b(?:not(?! only\b)|no(?! matter\b|\.\s*\d)|none|nothing|nobody|nowhere|never|neither|cannot|without"
    r"|dont|doesnt|didnt|isnt|arent|wasnt|werent|cant|couldnt|wouldnt|shouldnt|wont|havent|hasnt|hadnt|aint)\b"
    r"|n['’]t\b"
)
_ZH_NEGATION = re.compile(r"[不没无非未别勿莫]")
# Removed before counting, as they do not negate the question: A-not-A (是不是, 有没有) and a clause-final 不/没
# ("能带上火车不?") ask yes or no; 别 is mostly part of a word (区别, 特别, 别人), rarely "don't"; the words
# listed have plain synonyms a paraphrase may use (不同/区别, 非常/很, 无线/wifi, 尿不湿/纸尿裤). Every branch
# starts with one literal character, so `re` skips ahead to those instead of trying every position of a long text.
_ZH_NOT_NEGATING = re.compile(
    r"不(?<=(.)不)\1|没(?<=(.)没)\2|有没|不(?=\s*(?:[?？。!！~～]|$))|没(?=\s*(?:[?？。!！~～]|$))"
    r"|不好意思|不错|不过|不同|不一样|不少|不久|不仅|不但|不管(?!用)|不论|不断|不然|尿不湿"
    r"|无论|无故|无线|无限|无锡|非常|未来|出没"
    r"|别(?<=[区特分辨级性类识差告鉴个派道送离判职诀]别)|别[人的处墅名称致针]"
)


def semantic_query(body: dict[str, Any]) -> str | None:
    """The text of the last message when it is a user message with string content; else None (not cacheable)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    content = last.get("content")
    return content if isinstance(content, str) else None


def semantic_context_key(body: dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical request without the last user message's text (but with its numbers and,
    when negated, its polarity), the delivery fields and the reasoning earlier assistant turns pass back (a
    model's thoughts vary from run to run; the conversation is what it said)."""
    canonical = {k: v for k, v in body.items() if k not in DELIVERY_FIELDS}
    if (query := semantic_query(body)) is not None:
        *earlier, last = body["messages"]
        earlier = [{k: v for k, v in turn.items() if k not in REASONING_FIELDS} for turn in earlier]
        canonical["messages"] = [*earlier, {k: v for k, v in last.items() if k != "content"}]
        canonical["query_numbers"] = query_numbers(query)
        if query_negated(query):  # only then: a plain question keeps the key it had before polarity was added
            canonical["query_negated"] = True
    text = json.dumps(canonical, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def query_numbers(text: str) -> list[str]:
    """The numbers in `text`, in order, without thousands separators ("1,500" and "1500" are one number)."""
    return [_THOUSANDS.sub("", number) for number in _NUMBER.findall(text)]


def query_negated(text: str) -> bool:
    """Whether `text` is negated: an odd number of negations (not, n't, never, without, 不, 没, 无法, ...) in English
    or Chinese, leaving out words that do not negate the question (非常, 不错, 是不是, "not only", ...)."""
    negations = len(_EN_NEGATION.findall(text.lower())) + len(_ZH_NEGATION.findall(_ZH_NOT_NEGATING.sub(" ", text)))
    return negations % 2 == 1
