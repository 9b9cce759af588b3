"""The OpenAPI document at schema/ (drf-spectacular, the ``api-schema`` extra)."""

from __future__ import annotations

import json

import pytest
import yaml

from django_delayjobs.rest.filters import JobFilterSerializer
from django_delayjobs.rest.serializers import JobDetailSerializer

from .test_rest_helpers import client_for, make_user, url

# Without the extra, schema/ is not served and these tests are skipped.
GENERATOR_STATS = pytest.importorskip("drf_spectacular.drainage").GENERATOR_STATS
validate_schema = pytest.importorskip("drf_spectacular.validation").validate_schema

pytestmark = pytest.mark.django_db(transaction=True)

ENDPOINTS = {
    ("get", "/api/delayjobs/jobs/"),
    ("get", "/api/delayjobs/jobs/{id}/"),
    ("get", "/api/delayjobs/jobs/{id}/events/"),
    ("post", "/api/delayjobs/jobs/{id}/cancel/"),
    ("post", "/api/delayjobs/jobs/{id}/reschedule/"),
    ("post", "/api/delayjobs/jobs/{id}/requeue/"),
    ("get", "/api/delayjobs/queues/"),
    ("post", "/api/delayjobs/callbacks/"),
    ("post", "/api/delayjobs/callbacks/cancel/"),
    ("post", "/api/delayjobs/callbacks/reschedule/"),
}


@pytest.fixture
def schema():
    GENERATOR_STATS.reset()
    response = client_for(make_user(superuser=True)).get(url("schema"), {"format": "json"})
    assert response.status_code == 200
    document = json.loads(response.content)
    # drf-spectacular reports what it could not work out here instead of raising
    assert not GENERATOR_STATS, (GENERATOR_STATS._warn_cache, GENERATOR_STATS._error_cache)
    return document


def test_schema_is_valid_openapi_with_exactly_our_endpoints(schema):
    validate_schema(schema)
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "django-delayjobs API"
    found = {(method, path) for path, ops in schema["paths"].items() for method in ops}
    assert found == ENDPOINTS


def ref(response: dict) -> str:
    return response["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]


def test_status_codes_and_bodies_are_documented(schema):
    paths, components = schema["paths"], schema["components"]["schemas"]
    for verb in ("cancel", "reschedule", "requeue"):
        op = paths[f"/api/delayjobs/jobs/{{id}}/{verb}/"]["post"]
        assert set(op["responses"]) == {"200", "400", "403", "404", "409", "503"}
        assert ref(op["responses"]["200"]) == "JobDetail"
        assert ref(op["responses"]["409"]) == "Conflict"
    assert set(components["Conflict"]["properties"]) == {"detail", "status"}
    reschedule = paths["/api/delayjobs/jobs/{id}/reschedule/"]["post"]
    body = components[ref(reschedule["requestBody"])]
    assert set(body["properties"]) == {"in", "at"} and body["properties"]["in"]["minimum"] == 0
    queues = paths["/api/delayjobs/queues/"]["get"]
    assert set(queues["responses"]) == {"200", "400", "403", "503"}  # 400: an unknown parameter
    assert set(components["JobDetail"]["properties"]) == set(JobDetailSerializer().fields)
    # the callbacks answer the full job with view_job, else a receipt: both are documented
    create = paths["/api/delayjobs/callbacks/"]["post"]["responses"]
    assert ref(create["200"]) == ref(create["201"]) == "CallbackJobOrReceipt"
    either = components["CallbackJobOrReceipt"]["oneOf"]
    assert [one["$ref"].rsplit("/", 1)[1] for one in either] == ["Job", "CallbackReceipt"]
    assert set(components["CallbackReceipt"]["properties"]) == {
        "id",
        "queue",
        "key",
        "status",
        "run_at",
    }
    cancel = paths["/api/delayjobs/callbacks/cancel/"]["post"]["responses"]
    assert ref(cancel["200"]) == "CallbackJobDetailOrReceipt"
    # every endpoint answers 503 while the database cannot (a JSON body, as DRF's errors)
    for path, ops in paths.items():
        for verb, op in ops.items():
            assert ref(op["responses"]["503"]) == "Detail", (verb, path)


def test_list_documents_every_filter_and_the_paging(schema):
    op = schema["paths"]["/api/delayjobs/jobs/"]["get"]
    names = {p["name"] for p in op["parameters"]}
    assert names == set(JobFilterSerializer().fields) | {"cursor", "page_size"}
    page = schema["components"]["schemas"][ref(op["responses"]["200"])]
    assert set(page["properties"]) == {"next", "previous", "results"}


def test_the_events_endpoint_documents_its_paging(schema):
    op = schema["paths"]["/api/delayjobs/jobs/{id}/events/"]["get"]
    assert {p["name"] for p in op["parameters"]} == {"id", "cursor", "page_size"}
    assert set(op["responses"]) == {"200", "400", "403", "404", "503"}
    page = schema["components"]["schemas"][ref(op["responses"]["200"])]
    assert set(page["properties"]) == {"next", "previous", "results"}
    assert page["properties"]["results"]["items"]["$ref"].endswith("/JobEvent")
    detail = schema["components"]["schemas"]["JobDetail"]["properties"]
    assert detail["events_omitted"]["type"] == "integer"


def test_schema_is_yaml_by_default_and_as_private_as_the_api():
    response = client_for(make_user(superuser=True)).get(url("schema"))
    assert response["Content-Type"].startswith("application/vnd.oai.openapi")
    assert yaml.safe_load(response.content)["info"]["title"] == "django-delayjobs API"
    assert client_for(make_user("eve", staff=False)).get(url("schema")).status_code == 403
    assert client_for(None).get(url("schema")).status_code == 403
