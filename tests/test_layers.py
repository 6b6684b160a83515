"""The house's one rule, checked: imports point only downwards, faces -> domain -> engines.

See ARCHITECTURE.md. A face (pages, REST, relays, queue entry points) reaches an engine only through
the domain, and engines know nothing of Django or of the layers above them.
"""

import grimp
import pytest

PACKAGES = ("lebureau", "desktops", "billing", "missioncontrol", "proxies", "workers")
# Longest prefix wins: `desktops.api` is a face inside the domain's package.
LAYERS = {
    "lebureau": 0,  # the wiring: settings, URLs, ASGI, the Celery app
    "missioncontrol": 1,
    "proxies": 1,
    "desktops.api": 1,
    "workers": 1,  # workers.tasks, the queue's face (and the app's migrations)
    "desktops": 2,
    "billing": 2,
    "workers.drivers": 3,
}
NAMES = {0: "wiring", 1: "face", 2: "domain", 3: "engine"}
FACE, ENGINE = 1, 3
# What an engine may not know: the web framework and the layers above it.
NOT_FOR_ENGINES = ("django", "rest_framework", "channels", "celery", "allauth", "django_eventstream")


def layer(module: str) -> int:
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[prefix]


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph(*PACKAGES, include_external_packages=True)


def imports(graph, module):
    for imported in graph.find_modules_directly_imported_by(module):
        for detail in graph.get_import_details(importer=module, imported=imported):
            yield imported, detail["line_number"]


def test_no_import_points_up(graph):
    upward = [
        f"{module}:{line} ({NAMES[layer(module)]}) imports {imported} ({NAMES[layer(imported)]})"
        for module in sorted(graph.modules)
        if module.split(".")[0] in PACKAGES
        for imported, line in imports(graph, module)
        if imported.split(".")[0] in PACKAGES and layer(imported) < layer(module)
    ]
    assert not upward, "\n".join(upward)


def test_faces_reach_engines_only_through_the_domain(graph):
    skipping = [
        f"{module}:{line} imports {imported}"
        for module in sorted(graph.modules)
        if module.split(".")[0] in PACKAGES and layer(module) == FACE
        for imported, line in imports(graph, module)
        if imported.split(".")[0] in PACKAGES and layer(imported) == ENGINE
    ]
    assert not skipping, "\n".join(skipping)


def test_engines_know_no_django(graph):
    engines = [m for m in graph.modules if m.startswith("workers.drivers")]
    assert engines
    known = [
        f"{module}:{line} imports {imported}"
        for module in sorted(engines)
        for imported, line in imports(graph, module)
        if imported.split(".")[0] in NOT_FOR_ENGINES
    ]
    assert not known, "\n".join(known)
