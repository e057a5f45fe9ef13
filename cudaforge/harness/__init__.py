"""Proof and measurement of one candidate against its reference: the problem, the evaluation
options (one tolerance table), the comparison, the guards, the in-worker run and the worker
pools that run candidates away from the user's process."""
