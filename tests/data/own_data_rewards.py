"""A reward of a user's own for test_own_data_cli.py, imported by name (``own_data_rewards:...``):
pytest puts this folder on sys.path, and the reward workers get the parent's sys.path."""

EXPECTED_TOPICS = {"Write a haiku": "sea", "Write a limerick": "cat"}


def inputs_as_documented(prompts, completions, gold, answer, topic, **kwargs):
    """1.0 where a prompt-only record reached the reward as docs/rewards.md says: its problem text
    as ``prompts``, no gold and no answer (None), its own fields as columns; 0.0 otherwise."""
    return [1.0 if EXPECTED_TOPICS.get(p) == t and g is None and a is None else 0.0
            for p, g, a, t in zip(prompts, gold, answer, topic)]
