"""Decision evals: the shipped tasks read through an engine, and what the per-record evidence says about them.

Tasks and samples, the runner (``decide eval tasks``), engine agreement, scores, paired comparisons, and the
read-policy studies (label styles, calibration modes, read modes, debiasing, prior figures, dev reads,
regression).
"""
