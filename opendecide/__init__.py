"""opendecide: typed decisions with probabilities, served from open models in Jev's, OpenAI's and Google's
wire formats.

The code lives in layer packages (``readers``, ``calibration``, ``service``, ``eval``, ``deploy``);
this package only holds the ``decide`` entry point that mounts each layer's commands.
"""
