"""Chat messages → prompt token ids, with the template training and eval use.

A conversation of one user message renders to exactly `tunix_rt.render.prompt_ids(question,
tok, system_prompt)` (what eval scored and training saw). Longer conversations continue the
same turn format: each earlier turn is `<start_of_turn>{user|model}\\n{text}<end_of_turn>\\n`,
and the system prompt sits at the top of the first user turn, as in training. Message text
is always encoded as text: a message cannot forge a control token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tunix_rt.errors import BadInput
from tunix_rt.models.tokenizer import ChatTokenizer

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "model"}


@dataclass(frozen=True)
class Message:
    role: str  # system | developer | user | assistant
    content: str


def split_system(messages: Sequence[Message], default_system: str) -> tuple[str, list[Message]]:
    """The system prompt (the messages' system/developer turns joined, else the default) and
    the remaining user/assistant turns, which must alternate and end with a user turn."""
    system = [m.content for m in messages if ROLES.get(m.role) == "system"]
    turns = [m for m in messages if ROLES.get(m.role) != "system"]
    unknown = sorted({m.role for m in messages if m.role not in ROLES})
    if unknown:
        raise BadInput(f"unsupported message role(s) {unknown}: use system, user or assistant")
    if not turns or turns[-1].role != "user":
        raise BadInput("the last message must be a user message")
    for i, m in enumerate(turns):
        if (m.role == "user") != (i % 2 == 0):
            raise BadInput(f"messages must alternate user and assistant (turn {i + 1} is {m.role})")
    return ("\n\n".join(system) if system else default_system), turns


def chat_prompt_ids(messages: Sequence[Message], tok: ChatTokenizer, default_system: str) -> list[int]:
    """Token ids of the conversation up to and including "<start_of_turn>model\\n"."""
    system, turns = split_system(messages, default_system)
    ids = [tok.bos_id]
    for i, m in enumerate(turns):
        text = m.content
        if i == 0 and system:
            text = f"{system}\n\n{text}"
        ids += [tok.sot_id] + tok.encode(f"{ROLES[m.role]}\n{text}") + [tok.eot_id] + tok.encode("\n")
    return ids + [tok.sot_id] + tok.encode("model\n")
