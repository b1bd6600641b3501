"""The search space: the sweep forms of Hydra's override grammar (`choice`, `range`, `interval`, `a,b,c`) in a
search config's params and on the command line, as Optuna distributions; a trial's values back as overrides."""

from __future__ import annotations

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep

from vit.search.study import (
    SearchError,
)


def search_space(params: dict, arguments: list[str]) -> tuple[dict, list[str]]:
    """`params` of the sweeper config and the command line's overrides as ({key: distribution}, fixed overrides).
    A sweep form (`choice`, `range`, `interval`, `a,b,c`) is searched; any other value is passed to every trial."""
    parser = OverridesParser.create()
    lines = [f"{key}={value}" for key, value in params.items()] + list(arguments)
    space, fixed = {}, []
    for line in lines:
        try:
            [override] = parser.parse_overrides([line])
        except Exception as err:
            reason = str(err).strip().splitlines()[0]
            raise SearchError(f"cannot parse the search parameter {line!r}: {reason}") from None
        if override.is_sweep_override():
            space[override.get_key_element()] = distribution(override)
        else:
            fixed.append(line)
    return space, fixed


def distribution(override: Override):
    import optuna.distributions as d

    value, key = override.value(), override.get_key_element()
    if isinstance(value, ChoiceSweep):
        choices = list(value.list)
        if any(isinstance(c, (dict, list)) for c in choices):
            raise SearchError(f"{key}: choice() of dicts or lists cannot be searched; give names or numbers")
        return d.CategoricalDistribution(choices)
    if isinstance(value, RangeSweep):
        start, stop, step = value.start, value.stop, value.step
        if all(isinstance(x, int) for x in (start, stop, step)):
            return d.IntDistribution(int(start), int(stop) - int(step), step=int(step))
        values = list(override.sweep_iterator())
        return d.FloatDistribution(float(start), float(values[-1]), step=float(step))
    if isinstance(value, IntervalSweep):
        log_scale = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return d.IntDistribution(value.start, value.end, log=log_scale)
        return d.FloatDistribution(float(value.start), float(value.end), log=log_scale)
    raise SearchError(f"{key}: {override.input_line} is a sweep form the Optuna sweeper cannot search")


def suggest(trial, key: str, dist):
    import optuna.distributions as d

    if isinstance(dist, d.CategoricalDistribution):
        return trial.suggest_categorical(key, dist.choices)
    if isinstance(dist, d.IntDistribution):
        return trial.suggest_int(key, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_float(key, dist.low, dist.high, step=dist.step, log=dist.log)


def first_value(dist):
    return dist.choices[0] if hasattr(dist, "choices") else dist.low


def format_value(value) -> str:
    """A parameter as a Hydra override value: null, true/false, numbers as Python writes them, plain names."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    return text if text.replace("-", "").replace("_", "").replace(".", "").isalnum() else quote(text)


def quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
