import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostsite.settings")

app = Celery("hostsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
