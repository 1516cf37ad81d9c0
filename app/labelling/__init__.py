"""Labelling (`onepass label`): a user's states answered once, ranked, labelled into a verified file and
refitted in the background as labels arrive; an interactive session, apart from the fitting run."""
