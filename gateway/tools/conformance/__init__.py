"""Conformance: the suite-owned openai-compatible/1 recipes over the wire, the wire
scenarios, the host-route server scenarios (the target and the runner's side), the
project's own recipes, and the wire target manifest (``gateway.manifest``, which
``serve`` writes, re-exported)."""

from gateway.manifest import (
    WILDCARD_HOSTS as WILDCARD_HOSTS,
    ManifestError as ManifestError,
    host_route_providers as host_route_providers,
    target_manifest as target_manifest,
    write_atomically as write_atomically,
)

from ._host_route import (
    break_listener as break_listener,
    host_route_report as host_route_report,
    load_scenario as load_scenario,
    refuses as refuses,
    run_host_route as run_host_route,
)
from ._host_route_runner import (
    compile_imported_modules as compile_imported_modules,
    host_route_scenarios as host_route_scenarios,
    run_host_route_case as run_host_route_case,
    select_host_routes as select_host_routes,
    validate_route as validate_route,
)
from ._native import (
    CA_ANCHOR_REFUSED as CA_ANCHOR_REFUSED,
    native_available as native_available,
    native_client_options as native_client_options,
    native_openai_submit as native_openai_submit,
    self_signed_ca as self_signed_ca,
)
from ._run import run_plan as run_plan
from ._suite import (
    build_plan as build_plan,
    recipes_root as recipes_root,
    suite_capabilities as suite_capabilities,
)
from ._validate import (
    INCONCLUSIVE as INCONCLUSIVE,
    ValidationReport as ValidationReport,
    check_case as check_case,
    crossing_window_ms as crossing_window_ms,
    result_status as result_status,
    schema_errors as schema_errors,
    validate_results as validate_results,
)
from ._wire import (
    probe as probe,
    run_wire_probe as run_wire_probe,
    runner_token_submit as runner_token_submit,
    scenarios_for as scenarios_for,
    validate_wire_case as validate_wire_case,
)
