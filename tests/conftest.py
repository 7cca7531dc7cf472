"""Puts this folder on ``sys.path`` (pytest's default import mode does so for a conftest's folder).

The test folders mirror ``jaxsync/_src``'s layers; the shared helpers
(``helpers``, ``rule_cases``, ``sim_cases``) live here, next to this file.
"""
