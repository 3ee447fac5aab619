"""Reads template.yaml the way SAM and CloudFormation do, for the local stack.

Nothing here keeps a second list of resources: tables, queues, functions, routes and event
sources all come from the template, with Globals merged and intrinsic functions resolved.

Long because Template is the one reader of template.yaml: parameters, conditions, intrinsic
functions and Globals are resolved together, as CloudFormation does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement

from llmtasks_local.sam.function_spec import (
    PSEUDO_PARAMETERS,
    EventInvokeConfig,
    FunctionSpec,
    HttpRoute,
    LambdaAuthorizer,
    SqsSource,
    StreamSource,
)
from llmtasks_local.tool_errors import ToolError

NO_VALUE = object()


# libyaml's parser where PyYAML has it (its wheels do): the pure-Python one is several times
# slower on template.yaml, at each `llmtasks up` and `llmtasks invoke`.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _CfnLoader(_SafeLoader):  # type: ignore[valid-type,misc]
    """YAML with CloudFormation's short forms (!Ref, !GetAtt, !Sub, ...)."""


def _short_form(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    if tag_suffix == "Ref":
        return {"Ref": value}
    if tag_suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{tag_suffix}": value}


_CfnLoader.add_multi_constructor("!", _short_form)


class TemplateError(ToolError):
    """The template cannot be run locally: it does not parse, or names what does not exist."""


# The resource types the local stack provisions or runs, and those it knowingly leaves to AWS
# (nothing here depends on them locally). Any other type is refused: likely a typo.
EMULATED_TYPES = frozenset(
    {
        "AWS::Serverless::Function",
        "AWS::Serverless::HttpApi",
        "AWS::Serverless::LayerVersion",
        "AWS::DynamoDB::Table",
        "AWS::SQS::Queue",
        "AWS::S3::Bucket",
    }
)
IGNORED_TYPES = frozenset(
    {
        "AWS::CloudWatch::Alarm",
        "AWS::CloudWatch::CompositeAlarm",
        "AWS::CloudWatch::Dashboard",
        "AWS::SNS::Topic",
        "AWS::SNS::Subscription",
        "AWS::IAM::Role",
        "AWS::IAM::Policy",
        "AWS::IAM::ManagedPolicy",
        "AWS::Logs::LogGroup",
        "AWS::SQS::QueuePolicy",
        "AWS::SecretsManager::Secret",
        "AWS::SSM::Parameter",
        "AWS::Lambda::Permission",
        "AWS::Lambda::EventInvokeConfig",
    }
)


def _parse(path: Path) -> dict[str, Any]:
    """The template's YAML, or a TemplateError that names file:line:column and the parser's words."""
    try:
        text = path.read_text()
    except OSError as error:
        raise TemplateError(
            f"cannot read the template: {error.strerror}", where=str(path), fix="name it with --template/-t"
        ) from error
    try:
        body = yaml.load(text, Loader=_CfnLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = " ".join(part for part in (error.context, error.problem) if part)
        raise TemplateError(f"the template is not valid YAML: {problem}", where=where) from error
    except yaml.YAMLError as error:
        raise TemplateError(f"the template is not valid YAML: {error}", where=str(path)) from error
    if not isinstance(body, dict) or not isinstance(body.get("Resources"), dict):
        raise TemplateError(
            "the template has no Resources section", where=str(path), fix="is this a SAM template?"
        )
    for logical_id, resource in body["Resources"].items():
        kind = resource.get("Type") if isinstance(resource, dict) else None
        if kind not in EMULATED_TYPES | IGNORED_TYPES:
            raise TemplateError(
                f"resource {logical_id} has the type {kind!r}, which the local stack does not know",
                where=str(path),
                fix=f"check the spelling; it runs {', '.join(sorted(EMULATED_TYPES))}",
            )
    return body


def _check_parameter(name: str, value: str, spec: Mapping[str, Any], path: Path) -> None:
    """A parameter override refused as CloudFormation refuses it (AllowedValues, Min/MaxValue,
    AllowedPattern, Min/MaxLength, Number)."""

    def refuse(why: str, fix: str) -> TemplateError:
        return TemplateError(
            f"parameter {name}={value!r} {why}", where=f"{path}, --parameter-overrides", fix=fix
        )

    allowed = spec.get("AllowedValues")
    if allowed is not None and value not in [str(a) for a in allowed]:
        raise refuse("is not one of its AllowedValues", f"use one of {', '.join(map(str, allowed))}")
    if spec.get("Type") == "Number" or "MinValue" in spec or "MaxValue" in spec:
        try:
            number = float(value)
        except ValueError:
            raise refuse("is not a number", "give a number") from None
        low, high = spec.get("MinValue"), spec.get("MaxValue")
        span = f"from {low if low is not None else '-inf'} to {high if high is not None else 'inf'}"
        if (low is not None and number < float(low)) or (high is not None and number > float(high)):
            raise refuse(f"is outside its range {span}", f"give a value {span}")
    pattern = spec.get("AllowedPattern")
    if pattern is not None and not re.fullmatch(str(pattern), value):
        raise refuse(f"does not match its AllowedPattern {pattern}", "give a value that matches it")
    low_len, high_len = spec.get("MinLength"), spec.get("MaxLength")
    if (low_len is not None and len(value) < int(low_len)) or (
        high_len is not None and len(value) > int(high_len)
    ):
        raise refuse("has a length outside MinLength/MaxLength", "give a value of an allowed length")


@dataclass
class Template:
    path: Path
    body: dict[str, Any]
    parameters: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | str, parameter_overrides: Mapping[str, str] | None = None) -> Template:
        path = Path(path)
        body = _parse(path)
        declared = body.get("Parameters") or {}
        unknown = set(parameter_overrides or {}) - set(declared)
        if unknown:
            raise TemplateError(
                f"the template declares no parameter {', '.join(sorted(unknown))}",
                where=f"{path}, --parameter-overrides",
                fix=f"it declares {', '.join(sorted(declared)) or 'none'}",
            )
        parameters = {name: str(spec.get("Default", "")) for name, spec in declared.items()}
        for name, value in (parameter_overrides or {}).items():
            _check_parameter(name, str(value), declared[name], path)
            parameters[name] = str(value)
        return cls(path=path, body=body, parameters=parameters)

    @property
    def root(self) -> Path:
        return self.path.parent

    def resources(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {
            logical_id: resource.get("Properties") or {}
            for logical_id, resource in (self.body.get("Resources") or {}).items()
            if resource.get("Type") == resource_type
        }

    def resource_type(self, logical_id: str) -> str | None:
        resource = (self.body.get("Resources") or {}).get(logical_id)
        return resource.get("Type") if resource else None

    # --- intrinsic functions -----------------------------------------------------------------

    def resolve(self, value: Any, refs: Mapping[str, str], attributes: Mapping[tuple[str, str], str]) -> Any:
        """`value` with Ref, Fn::GetAtt, Fn::Sub, Fn::Join, Fn::If, ... replaced.

        `refs` maps a logical id to what Ref returns, `attributes` (id, attribute) to GetAtt.
        """

        def ref(name: str) -> str:
            if name in self.parameters:
                return self.parameters[name]
            if name in PSEUDO_PARAMETERS:
                return PSEUDO_PARAMETERS[name]
            if name in refs:
                return refs[name]
            raise TemplateError(
                f"a Ref to {name!r}, which is no parameter or resource of the template",
                where=str(self.path),
                fix="declare it, or correct the name",
            )

        def get_att(target: list[str]) -> str:
            key = (target[0], target[1])
            if key not in attributes:
                raise TemplateError(
                    f"GetAtt {target[0]}.{target[1]} names no resource attribute the local stack has",
                    where=str(self.path),
                    fix="correct the resource or attribute name",
                )
            return attributes[key]

        def sub(template: str, extra: Mapping[str, Any]) -> str:
            def one(found: re.Match[str]) -> str:
                name = found.group(1)
                if name in extra:
                    return str(extra[name])
                if "." in name and not name.startswith("AWS::"):
                    return get_att(name.split(".", 1))
                return ref(name)

            return re.sub(r"\$\{([^!}][^}]*)\}", one, template)

        def walk(node: Any) -> Any:  # noqa: PLR0911 - one branch per intrinsic function
            if isinstance(node, list):
                return [item for item in (walk(n) for n in node) if item is not NO_VALUE]
            if not isinstance(node, dict):
                return node
            if len(node) == 1:
                ((key, arg),) = node.items()
                if key == "Ref":
                    return NO_VALUE if arg == "AWS::NoValue" else ref(arg)
                if key == "Fn::GetAtt":
                    return get_att(arg if isinstance(arg, list) else arg.split(".", 1))
                if key == "Fn::Sub":
                    if isinstance(arg, list):
                        return sub(arg[0], {k: walk(v) for k, v in arg[1].items()})
                    return sub(arg, {})
                if key == "Fn::Join":
                    return str(arg[0]).join(str(walk(part)) for part in walk(arg[1]))
                if key == "Fn::Select":
                    return walk(arg[1])[int(walk(arg[0]))]
                if key == "Fn::If":
                    return walk(arg[1] if self.condition(arg[0], walk) else arg[2])
                if key in ("Fn::Equals", "Fn::Not", "Fn::And", "Fn::Or", "Condition"):
                    return self._evaluate(node, walk)
            return {k: v for k, v in ((k, walk(v)) for k, v in node.items()) if v is not NO_VALUE}

        return walk(value)

    def condition(self, name: str, walk: Any) -> bool:
        conditions = self.body.get("Conditions") or {}
        if name not in conditions:
            raise TemplateError(f"unknown condition '{name}'")
        return bool(self._evaluate(conditions[name], walk))

    def _evaluate(self, node: Any, walk: Any) -> bool:
        ((key, arg),) = node.items()
        if key == "Fn::Equals":
            return bool(walk(arg[0]) == walk(arg[1]))
        if key == "Fn::Not":
            return not self._evaluate(arg[0], walk)
        if key == "Fn::And":
            return all(self._evaluate(a, walk) for a in arg)
        if key == "Fn::Or":
            return any(self._evaluate(a, walk) for a in arg)
        if key == "Condition":
            return self.condition(arg, walk)
        raise TemplateError(f"unsupported condition function {key}")

    # --- functions ----------------------------------------------------------------------------

    def functions(
        self, refs: Mapping[str, str], attributes: Mapping[tuple[str, str], str]
    ) -> dict[str, FunctionSpec]:
        """Every AWS::Serverless::Function with Globals merged and intrinsics resolved."""
        defaults = (self.body.get("Globals") or {}).get("Function") or {}
        specs = {}
        for logical_id, own in self.resources("AWS::Serverless::Function").items():
            merged = {**defaults, **own}
            variables = {
                **((defaults.get("Environment") or {}).get("Variables") or {}),
                **((own.get("Environment") or {}).get("Variables") or {}),
            }
            resolved = self.resolve({**merged, "Environment": {"Variables": variables}}, refs, attributes)
            events = resolved.get("Events") or {}
            specs[logical_id] = FunctionSpec(
                logical_id=logical_id,
                code_dir=(self.root / str(resolved.get("CodeUri", "."))).resolve(),
                handler=str(resolved["Handler"]),
                timeout_s=int(resolved.get("Timeout", 3)),
                memory_mb=int(resolved.get("MemorySize", 128)),
                environment={k: str(v) for k, v in resolved["Environment"]["Variables"].items()},
                layer_dirs=tuple(self._layer_dir(layer) for layer in resolved.get("Layers") or ()),
                routes=tuple(
                    HttpRoute(
                        logical_id,
                        str(e["Properties"].get("Method", "ANY")).upper(),
                        e["Properties"]["Path"],
                        self._authorizer_of(
                            e["Properties"].get("ApiId"), e["Properties"].get("Auth"), refs, attributes
                        ),
                    )
                    for e in events.values()
                    if e.get("Type") == "HttpApi"
                ),
                sqs_sources=tuple(
                    _sqs_source(logical_id, name, e["Properties"])
                    for name, e in events.items()
                    if e.get("Type") == "SQS"
                ),
                stream_sources=tuple(
                    _stream_source(logical_id, name, e["Properties"])
                    for name, e in events.items()
                    if e.get("Type") == "DynamoDB"
                ),
                runtime=str(resolved.get("Runtime", "python3.12")),
                architecture=str((resolved.get("Architectures") or ["x86_64"])[0]),
                event_invoke=_event_invoke(resolved.get("EventInvokeConfig") or {}),
            )
            self._check_code(specs[logical_id])
            self._check_visibility(specs[logical_id], merged.get("Events") or {}, refs, attributes)
        return specs

    def check(self) -> None:
        """Every function resolved against stand-ins for what provisioning names, so that a
        mistake in one (a Ref or GetAtt to nothing, a CodeUri, Handler or layer that is not there,
        a queue's visibility under the function's Timeout, a requirements.txt line pip would not
        read) is said before anything starts, not once the endpoint runs and every table and
        queue is made, then stopped."""
        resources = self.body.get("Resources") or {}
        functions = self.functions({logical_id: logical_id for logical_id in resources}, _StandIns(resources))
        for spec in functions.values():  # what sam build would install for it
            requirements_of([spec.code_dir, *spec.layer_dirs])

    def _check_visibility(
        self,
        spec: FunctionSpec,
        events: Mapping[str, Any],
        refs: Mapping[str, str],
        attributes: Mapping[tuple[str, str], str],
    ) -> None:
        """An SQS event source whose queue's visibility timeout is under the function's Timeout is
        refused, as CreateEventSourceMapping refuses it (InvalidParameterValueException): a
        message would come back while the invocation that holds it still runs."""
        queues = self.resources("AWS::SQS::Queue")
        for name, event in events.items():
            if event.get("Type") != "SQS":
                continue
            queue = (event.get("Properties") or {}).get("Queue")
            target = queue.get("Fn::GetAtt") if isinstance(queue, dict) else None
            if not (isinstance(target, list) and target[0] in queues):
                continue  # a queue outside the template: its attributes are not known here
            # SQS's default is 30 s.
            visibility_s = int(self.resolve(queues[target[0]].get("VisibilityTimeout", 30), refs, attributes))
            if visibility_s < spec.timeout_s:
                raise TemplateError(
                    f"{spec.logical_id}'s event {name}: Queue visibility timeout: {visibility_s} seconds is"
                    f" less than Function timeout: {spec.timeout_s} seconds (CreateEventSourceMapping's"
                    " InvalidParameterValueException in AWS)",
                    where=str(self.path),
                    fix=f"give {target[0]} a VisibilityTimeout of at least the function's Timeout"
                    " (AWS advises six times it)",
                )

    def _check_code(self, spec: FunctionSpec) -> None:
        """A CodeUri or a handler module that does not exist is refused before anything runs."""
        if not spec.code_dir.is_dir():
            raise TemplateError(
                f"{spec.logical_id}'s CodeUri {spec.code_dir} is not a folder",
                where=str(self.path),
                fix="point CodeUri at the function's code, relative to the template",
            )
        if not spec.handler_file.is_file():
            raise TemplateError(
                f"{spec.logical_id}'s Handler {spec.handler} has no module at {spec.handler_file}",
                where=str(self.path),
                fix="Handler is module.function, relative to CodeUri",
            )

    def _layer_dir(self, layer: Any) -> Path:
        props = self.resources("AWS::Serverless::LayerVersion").get(str(layer))
        if props is None:
            raise TemplateError(
                f"layer {layer!r} is not an AWS::Serverless::LayerVersion of the template",
                where=str(self.path),
            )
        folder = (self.root / str(props.get("ContentUri", "."))).resolve()
        if not folder.is_dir():
            # A missing layer would leave its packages out of every sandbox that names it.
            raise TemplateError(
                f"layer {layer}'s ContentUri {folder} is not a folder",
                where=str(self.path),
                fix="point ContentUri at the layer's code, relative to the template",
            )
        return folder

    def _authorizer_of(
        self,
        api_id: Any,
        route_auth: Mapping[str, Any] | None,
        refs: Mapping[str, str],
        attributes: Mapping[tuple[str, str], str],
    ) -> LambdaAuthorizer | None:
        """The authorizer of a route: its own Auth.Authorizer, else its Api's DefaultAuthorizer;
        NONE means none. Lambda authorizers only (what this template uses)."""
        api = (self.body.get("Resources") or {}).get(str(api_id), {}) if api_id else {}
        auth = (api.get("Properties") or {}).get("Auth") or {}
        name = (route_auth or {}).get("Authorizer", auth.get("DefaultAuthorizer"))
        if not name or name == "NONE":
            return None
        config = (auth.get("Authorizers") or {}).get(name) or {}
        arn = config.get("FunctionArn")
        if not (
            isinstance(arn, dict)
            and isinstance(arn.get("Fn::GetAtt"), list)
            and arn["Fn::GetAtt"][1] == "Arn"
        ):
            raise TemplateError(
                f"authorizer {name}: the emulator runs Lambda authorizers given as !GetAtt Fn.Arn"
            )
        identity = self.resolve(config.get("Identity") or {}, refs, attributes)
        return LambdaAuthorizer(
            function_id=str(arn["Fn::GetAtt"][0]),
            identity_headers=tuple(str(h) for h in identity.get("Headers") or ()),
            # SAM's default when an Identity is given: 300 s
            ttl_s=int(identity.get("ReauthorizeEvery", 300)) if identity else 0,
        )


def _report_failures(props: Mapping[str, Any]) -> bool:
    return "ReportBatchItemFailures" in (props.get("FunctionResponseTypes") or [])


def _event_invoke(config: Mapping[str, Any]) -> EventInvokeConfig:
    on_failure = (config.get("DestinationConfig") or {}).get("OnFailure") or {}
    return EventInvokeConfig(
        maximum_retry_attempts=int(config.get("MaximumRetryAttempts", 2)),
        on_failure_type=on_failure.get("Type"),
        on_failure_arn=on_failure.get("Destination"),
    )


def _sqs_source(function_id: str, name: str, props: Mapping[str, Any]) -> SqsSource:
    concurrency = (props.get("ScalingConfig") or {}).get("MaximumConcurrency")
    return SqsSource(
        function_id=function_id,
        name=name,
        queue_arn=str(props["Queue"]),
        batch_size=int(props.get("BatchSize", 10)),
        batching_window_s=float(props.get("MaximumBatchingWindowInSeconds", 0)),
        report_batch_item_failures=_report_failures(props),
        maximum_concurrency=int(concurrency) if concurrency is not None else None,
        enabled=bool(props.get("Enabled", True)),
    )


def _stream_source(function_id: str, name: str, props: Mapping[str, Any]) -> StreamSource:
    filters = (props.get("FilterCriteria") or {}).get("Filters") or []
    on_failure = ((props.get("DestinationConfig") or {}).get("OnFailure") or {}).get("Destination")
    return StreamSource(
        function_id=function_id,
        name=name,
        stream_arn=str(props["Stream"]),
        starting_position=str(props.get("StartingPosition", "LATEST")),
        batch_size=int(props.get("BatchSize", 100)),
        batching_window_s=float(props.get("MaximumBatchingWindowInSeconds", 0)),
        maximum_retry_attempts=int(props.get("MaximumRetryAttempts", -1)),
        bisect_on_error=bool(props.get("BisectBatchOnFunctionError", False)),
        report_batch_item_failures=_report_failures(props),
        filter_patterns=tuple(
            f["Pattern"] if isinstance(f["Pattern"], str) else json.dumps(f["Pattern"]) for f in filters
        ),
        on_failure_arn=str(on_failure) if on_failure else None,
        enabled=bool(props.get("Enabled", True)),
    )


class _StandIns(Mapping[tuple[str, str], str]):
    """Any GetAtt of a resource of the template, answered with a stand-in (Template.check)."""

    def __init__(self, resources: Mapping[str, Any]) -> None:
        self._resources = resources

    def __getitem__(self, key: tuple[str, str]) -> str:
        if key[0] not in self._resources:
            raise KeyError(key)
        return ".".join(key)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(())

    def __len__(self) -> int:
        return 0


def requirements_of(folders: Iterable[Path]) -> list[Requirement]:
    """The requirements.txt of each folder (a function's CodeUri, a layer's ContentUri), as
    `sam build` reads them: one requirement a line; comments, blank lines and pip's options
    (`-r`, `--index-url`, ...) left out."""
    found: list[Requirement] = []
    for folder in folders:
        path = folder / "requirements.txt"
        if not path.is_file():
            continue
        for number, written in enumerate(path.read_text().splitlines(), 1):
            line = written.split(" #", 1)[0].strip()
            if not line or line.startswith(("#", "-")):
                continue
            try:
                found.append(Requirement(line))
            except InvalidRequirement as error:
                # packaging's message goes on with the line and a caret under the fault
                raise TemplateError(
                    f"{line!r} is not a requirement ({str(error).splitlines()[0]})",
                    where=f"{path}:{number}",
                    fix="one requirement a line, as pip reads them (name, extras, version, marker)",
                ) from error
    return found
