"""Protocol buffer messages as plain Python values, and records as a pandas DataFrame."""


def _is_repeated(field):
    flag = getattr(field, "is_repeated", None)
    if flag is not None:
        return flag() if callable(flag) else flag
    return field.label == field.LABEL_REPEATED


def _scalar(field, value):
    if field.message_type is not None:
        return message_to_dict(value)
    if field.enum_type is not None:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else value
    return value


def message_to_dict(message):
    """Every field by its proto name: enums as their names, int64 as int, repeated fields
    as lists, maps as dicts, sub-messages as dicts; a proto3 `optional` field that is
    not set is None (unlike protobuf's MessageToDict, nothing becomes a string)."""
    out = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _scalar(value_field, v) for k, v in value.items()}
        elif _is_repeated(field):
            out[field.name] = [_scalar(field, v) for v in value]
        elif (field.message_type is None and getattr(field, "has_presence", False) and
              not message.HasField(field.name)):
            out[field.name] = None
        else:
            out[field.name] = _scalar(field, value)
    return out


def to_frame(records):
    """A list of dicts (metrics(), list(), workers(), logs()) as a pandas DataFrame, one
    row each. ImportError when pandas is not installed."""
    try:
        import pandas
    except ImportError as e:
        raise ImportError("to_frame needs pandas: pip install pandas "
                          "(or ddp-client[pandas])") from e
    return pandas.DataFrame.from_records(list(records))
