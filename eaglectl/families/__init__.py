"""Drafter families beside EAGLE-3 (DFlash, DSpark, P-EAGLE): their files opened (checkpoint), what vLLM reads of
them (reading), their traps (rules), `inspect` on them (inspect) and `convert` between their producers' layouts
(convert). Their detection signals and layouts are data in the dialect registry (formats/families.py), which
detection reads before any dialect.

Commands do not branch on the class of what they opened: a DrafterCheckpoint and a FamilyCheckpoint both say
whether EAGLE-3's dialects read them (`eagle3_layout`) and which family they belong to (`family_checkpoint`).
Importing this package registers P-EAGLE's check with the rule registry (rules.run_checks), which every command
does by importing it."""

from . import rules  # noqa: F401  (registers the P-EAGLE check)
