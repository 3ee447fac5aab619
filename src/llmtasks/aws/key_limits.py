"""Provider keys' tokens and requests a minute, as every worker shares them: one TasksTable item
per key (`ratelimit#<id>`, the id a hash of the key, never the key), read and moved with the
rules of domain/rate_limits.py.

A reservation is one conditional UpdateItem: it moves the key's GCRA times on by the call's
tokens and one request only if both stay within the minute (and no 429 holds the key). DynamoDB
has no max(), so the write names, for each time, whether it moves on from its own value (the
key is busy) or from now (idle); the guess comes from the item as last seen, and a wrong guess
or a full key fails the condition and returns the item as it is (ALL_OLD), from which the exact
wait, or the right guess, follows. A full key costs that one failed write, never a sleep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from llmtasks.aws.dynamo import deserialize, dynamodb_errors, is_condition_failure
from llmtasks.domain.errors import BackendError
from llmtasks.domain.rate_limits import KeyLimits, KeyUse, RateHeaders

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

TRIES = 5  # a wrong guess costs a try; two concurrent changes of state in a row are rare
_TIMES = (("tokens_at", "tok"), ("requests_at", "req"))


class KeyRates:
    """The shared use of provider keys (or of a tenant's share: any id, any limits)."""

    def __init__(self, table_name: str, client: DynamoDBClient, *, prefix: str = "ratelimit#") -> None:
        self._table = table_name
        self._client = client
        self._prefix = prefix
        self.seen: dict[str, KeyUse] = {}  # each id's item as this sandbox last saw it

    def reserve(self, key_id: str, limits: KeyLimits, tokens: int, now: float) -> float:
        """A call of `tokens` and one request reserved on the key: 0. When the key has no room,
        nothing is reserved and the seconds until it has are returned."""
        for _ in range(TRIES):
            use = self.seen.get(key_id, KeyUse())
            hold = (use.held_until or 0.0) - now
            if hold > 0:
                return hold  # held by a 429 (a hold only ever grows): no write can succeed
            moves = {
                "tok": limits.tokens_s(tokens) if limits.tpm else None,
                "req": limits.request_s() or None,
            }
            sets, conditions = [], ["(attribute_not_exists(held_until) OR held_until <= :now)"]
            values: dict[str, Any] = {":now": now}
            for (name, short), at in zip(_TIMES, (use.tokens_at, use.requests_at), strict=True):
                move = moves[short]
                if move is None:
                    continue
                # What the running calls hold, for the wait should their answers give it back
                held = ", tokens_held = if_not_exists(tokens_held, :zero) + :tok" if short == "tok" else ""
                values |= {":zero": 0} if held else {}
                if at is not None and at >= now:  # busy: on from its own time, within the minute
                    sets.append(f"{name} = {name} + :{short}{held}")
                    conditions.append(f"{name} >= :now AND {name} <= :{short}_most")
                    values |= {f":{short}": move, f":{short}_most": now + 60.0 - move}
                else:  # idle: on from now
                    sets.append(f"{name} = :{short}_new{held}")
                    conditions.append(f"(attribute_not_exists({name}) OR {name} < :now)")
                    values |= {f":{short}_new": now + move} | ({":tok": move} if held else {})
            if not sets:
                return 0.0
            if self._update(key_id, "SET " + ", ".join(sets), " AND ".join(conditions), values):
                return 0.0
            wait = self.seen[key_id].wait_s(limits, tokens, now)
            if wait > 0:
                return wait
        raise BackendError("a provider key's rate limit could not be reserved: too much contention")

    def settle(self, key_id: str, limits: KeyLimits, reserved: int, used: int) -> None:
        """The call used `used` tokens of the `reserved`: the difference given back (or taken)."""
        if limits.tpm is None:
            return
        held = limits.tokens_s(reserved)
        self._update(
            key_id,
            "SET tokens_at = tokens_at + :d, tokens_held = if_not_exists(tokens_held, :zero) - :held",
            "attribute_exists(tokens_at)",
            {":d": limits.tokens_s(used) - held, ":held": held, ":zero": 0},
        )

    def learn(self, key_id: str, heard: RateHeaders, now: float, *, unsettled_tokens: int = 0) -> KeyLimits:
        """What the provider's headers say of the key: its limits (they win over the config), and
        its use, which a client of the key other than llmtasks may have raised (the times are
        moved on to it, never back). Returns the limits it said."""
        said = heard.limits
        use = self.seen.get(key_id, KeyUse())
        if said.bounded and said != use.said:
            sets = [f"{name} = :{name}" for name in ("tpm", "rpm") if getattr(said, name) is not None]
            self._update(key_id, "SET " + ", ".join(sets), None, {f":{k}": v for k, v in said if v})
        limits = said.over(use.said)
        for (name, short), used_s, at in zip(
            _TIMES,
            heard.used_s(limits, unsettled_tokens=unsettled_tokens),
            (use.tokens_at, use.requests_at),
            strict=True,
        ):
            if used_s is None or used_s <= 0.0 or (at is not None and at >= now + used_s):
                continue
            self._update(
                key_id,
                f"SET {name} = :{short}",
                f"attribute_not_exists({name}) OR {name} < :{short}",
                {f":{short}": now + used_s},
            )
        return limits

    def hold(self, key_id: str, until: float) -> None:
        """No call on the key before `until` (a 429's Retry-After or reset), for every worker."""
        self._update(
            key_id,
            "SET held_until = :until",
            "attribute_not_exists(held_until) OR held_until < :until",
            {":until": until},
        )

    def _update(self, key_id: str, update: str, condition: str | None, values: dict[str, Any]) -> bool:
        """One write to the id's item, what it holds then kept in `seen`; False when the
        condition failed (`seen` then holds the item as it was)."""
        request: dict[str, Any] = {
            "TableName": self._table,
            "Key": {"pk": {"S": self._prefix + key_id}},
            "UpdateExpression": update,
            "ExpressionAttributeValues": {name: {"N": repr(value)} for name, value in values.items()},
            "ReturnValues": "ALL_NEW",
        }
        if condition is not None:
            request |= {"ConditionExpression": condition, "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
        try:
            with dynamodb_errors("a rate limit's write"):
                reply = self._client.update_item(**request)
        except BackendError as error:
            cause = error.__cause__
            if isinstance(cause, ClientError) and is_condition_failure(cause):
                self.seen[key_id] = _use(cause.response.get("Item") or {})  # type: ignore[arg-type]
                return False
            raise
        self.seen[key_id] = _use(reply.get("Attributes", {}))
        return True


def _use(item: dict[str, Any]) -> KeyUse:
    values = deserialize(item)
    return KeyUse(
        tokens_at=values.get("tokens_at"),
        tokens_held=values.get("tokens_held"),
        requests_at=values.get("requests_at"),
        held_until=values.get("held_until"),
        said=KeyLimits(tpm=values.get("tpm"), rpm=values.get("rpm")),
    )
