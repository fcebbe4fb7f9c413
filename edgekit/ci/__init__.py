"""`edgekit ci`: an edgekit.toml's models x targets x devices deployed through ``edgekit.api``,
gated against a baseline, reported as JUnit XML, JSON, markdown and HTML.

>>> from edgekit.ci import load_config, run_ci  # doctest: +SKIP
>>> result = run_ci(load_config(Path("edgekit.toml")), Events())  # doctest: +SKIP
>>> result.exit_code  # doctest: +SKIP
"""

from edgekit.ci.config import CiConfig, ConfigError, load_config
from edgekit.ci.run import CiResult, run_ci

__all__ = ["CiConfig", "CiResult", "ConfigError", "load_config", "run_ci"]
