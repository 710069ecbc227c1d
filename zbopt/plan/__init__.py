"""Planning a model's run: the layer split across virtual stages chosen with the schedule, and the
split written out for the training frameworks (`zbopt.plan.exports`)."""
