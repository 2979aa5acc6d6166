"""The decision pipeline, apart from HTTP: question → reads → prior → calibration → abstention → answer.

reads.py       to_read: a wire question → what the reader reads (spec, option orders, method, body loc)
prior.py       the content-free option prior, measured once per question and divided out of covered reads
decide.py      a request's answers: read, prior, stored calibration, confidence, abstention; records kept
confidence.py  Jev's confidence formulas and answer_confidence, the one dispatch over question types
abstain.py     whether an answer is abstained: an uninformative read, or below x_min_confidence
examples.py    calibration from examples with gold answers: read as answers are read, then fit and store
images.py      the serving images each answer's provenance names
options.py     defaults and command-line options ``decide serve`` and ``decide eval`` share

No module here imports a web framework (tests/test_layers.py): service's HTTP part (app.py, routes/,
the middlewares) calls in, and eval imports from service only this package and service.protocol.
"""
