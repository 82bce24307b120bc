"""What every slash command answers with: a plain embed, the colour of an error, and how many autocomplete
choices Discord shows."""

from __future__ import annotations

from discord.types.embed import Embed as EmbedData

from bot.render import RUNNING_COLOUR

ERROR_COLOUR = 0xE74C3C
CHOICES_MAX = 25  # Discord shows at most 25 autocomplete choices


def plain_embed(title: str, description: str = "", colour: int = RUNNING_COLOUR) -> EmbedData:
    return {"title": title, "description": description, "color": colour}
