"""User rewards for the RL tests, imported by name (`rl_rewards:length_share`) as a user's own
module would be: a tiny random model never writes the format, so the built-in rewards are
all zero there and no group would carry a learning signal."""


def length_share(record, completion, reasoning, answer):
    """Varies with every sample: the completion's length in characters / 100."""
    return len(completion) / 100.0


def explodes(record, completion, reasoning, answer):
    raise ZeroDivisionError("division by zero in a user's reward")


def sleeps(record, completion, reasoning, answer):
    """A reward that hangs: sleeps 60 s per call (reward_timeout_s must stop the run)."""
    import time

    time.sleep(60)
    return 0.0
