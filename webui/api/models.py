"""`GET /v1/models` and `GET /v1/models/{id}`: the served models' cards, the first first, each
with whether it is loaded now (a model other than the first loads on the first request that
names it); a model answers under its id or an alias (`default` and `default_model` for the
first, the name it was served by), always with its id. What is served comes from the seam
(`Engines.served`). Runs in FastAPI's worker threads (the current user's key is checked
there too, webui/api/deps.py). No MLX.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from radixchat.core.seam.protocol import Engines, ServedModel
from radixchat.core.seam.requests import RequestError
from radixchat.webui.api.deps import EnginesDep, UserDep
from radixchat.webui.api.errors import ApiError
from radixchat.webui.api.shapes.replies import ModelCard, ModelList

router = APIRouter(prefix="/v1", tags=["models"])


def _card(engines: Engines, m: ServedModel) -> ModelCard:
    return ModelCard(id=m.model_id, created=engines.default.info.created, loaded=m.is_loaded, aliases=list(m.aliases))


# response_model=None: the cards go out as they are dumped, not through a model FastAPI would make
# of the return annotation
@router.get("/models", response_model=None)
def models(user: UserDep, engines: EnginesDep) -> dict[str, Any]:
    return ModelList(data=[_card(engines, m) for m in engines.served()]).model_dump()


@router.get("/models/{name:path}", response_model=None)
def model(name: str, user: UserDep, engines: EnginesDep) -> dict[str, Any]:
    try:
        return _card(engines, engines.find(name)).model_dump()
    except RequestError as e:
        raise ApiError(e.status, e.message, code=e.code, param="model") from None
