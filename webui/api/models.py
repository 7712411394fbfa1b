"""`GET /v1/models` and `GET /v1/models/{id}`: the one served model's card, under its id or
an alias (`default`, `default_model`), as a request would name it. What the model is comes
from the engine's seam (`info`). Runs in FastAPI's worker threads (the current user's key
is checked there too, webui/api/deps.py). No MLX.
"""

from __future__ import annotations

from fastapi import APIRouter

from radixchat.webui.api.deps import EngineDep, UserDep, check_model
from radixchat.webui.api.replies import ModelCard, ModelList

router = APIRouter(prefix="/v1", tags=["models"])


@router.get("/models")
def models(user: UserDep, engine: EngineDep):
    card = ModelCard(id=engine.info.model_id, created=engine.info.created)
    return ModelList(data=[card]).model_dump()


@router.get("/models/{name:path}")
def model(name: str, user: UserDep, engine: EngineDep):
    check_model(engine, name)  # the aliases answer with the served model's card
    return ModelCard(id=engine.info.model_id, created=engine.info.created).model_dump()
