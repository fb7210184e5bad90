"""ALFWorld (text): household tasks, played offline from games generated here (``env``, ``gen``)."""
