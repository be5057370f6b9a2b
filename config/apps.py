"""MongoDB-flavoured AppConfigs for contrib apps (django-mongodb-project 5.2.x template).

Contrib apps declare ``default_auto_field = AutoField``; on MongoDB every model needs an
``ObjectIdAutoField`` primary key, so these subclasses override it.
"""

from django.contrib.admin.apps import AdminConfig
from django.contrib.auth.apps import AuthConfig
from django.contrib.contenttypes.apps import ContentTypesConfig


class MongoAdminConfig(AdminConfig):
    default_auto_field = "django_mongodb_backend.fields.ObjectIdAutoField"


class MongoAuthConfig(AuthConfig):
    default_auto_field = "django_mongodb_backend.fields.ObjectIdAutoField"


class MongoContentTypesConfig(ContentTypesConfig):
    default_auto_field = "django_mongodb_backend.fields.ObjectIdAutoField"
