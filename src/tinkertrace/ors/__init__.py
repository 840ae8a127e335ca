"""OpenReward environments: an Open Reward Standard (ORS) client over HTTP (:mod:`.client`) and the
episode that plays one on the recording endpoint (:mod:`.agent`). Needs httpx (the serve extra) and the
OpenAI client.
"""

ORS_AGENT = "tinkertrace.ors.agent:run_episode"  # the agent and task source of an OpenReward environment
ORS_TASKS = "tinkertrace.ors.agent:load_tasks"
