"""agentkit.skillbank: textual skills in an editable file, and the retrievers that pick them."""

from agentkit.skillbank.bank import (
    Skill,
    SkillBank,
    SkillBankError,
    SkillStats,
    default_bank_for,
    render_skills,
    resolve_bank,
    starter_banks,
)
from agentkit.skillbank.retrieval import (
    REGISTRY,
    Retriever,
    SkillSelector,
    make_retriever,
    make_selector,
    policy_selector,
)

__all__ = ["Skill", "SkillBank", "SkillBankError", "SkillStats", "default_bank_for", "render_skills",
           "resolve_bank", "starter_banks", "REGISTRY", "Retriever", "SkillSelector", "make_retriever", "make_selector",
           "policy_selector"]
