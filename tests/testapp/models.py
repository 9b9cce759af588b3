import uuid

from django.db import models, transaction
from django.dispatch import Signal

from django_delayjobs import delayable

thing_paid = Signal()


class Thing(models.Model):
    name = models.CharField(max_length=50, default="")
    state = models.CharField(max_length=20, default="new")
    touched = models.PositiveIntegerField(default=0)

    @delayable
    def expire(self, reason: str = "late") -> str:
        with transaction.atomic():
            row = Thing.objects.select_for_update().get(pk=self.pk)
            if row.state != "new":
                return "left alone"
            row.state = f"expired:{reason}"
            row.save(update_fields=["state"])
        return "expired"

    @delayable
    def touch(self) -> None:
        Thing.objects.filter(pk=self.pk).update(touched=models.F("touched") + 1)

    @delayable
    def settle(self) -> int:
        """Marks the thing settled and cancels its other jobs, refusing (rolled back) if one
        of them already runs: what a payment does, run as a job."""
        from django_delayjobs import cancel_for

        Thing.objects.filter(pk=self.pk).update(state="settled")
        return cancel_for(self, fail_if_running=True)

    def not_delayable(self) -> None:
        pass

    def pay(self) -> None:
        with transaction.atomic():
            Thing.objects.filter(pk=self.pk).update(state="paid")
            self.state = "paid"
            thing_paid.send(sender=Thing, instance=self)


class Record(models.Model):
    """Rows written by test actions: one per effect, to count runs."""

    label = models.CharField(max_length=100)
    created = models.DateTimeField(auto_now_add=True)


class Pair(models.Model):
    """A model with Django 5.2's composite primary key: ``pk`` is a tuple."""

    pk = models.CompositePrimaryKey("a", "b")
    a = models.IntegerField()
    b = models.IntegerField()
    touched = models.IntegerField(default=0)

    @delayable
    def touch(self) -> None:
        Pair.objects.filter(pk=self.pk).update(touched=models.F("touched") + 1)


class Sku(models.Model):
    """A model with a text primary key, which the admin quotes in its URLs."""

    code = models.CharField(max_length=40, primary_key=True)

    @delayable
    def touch(self) -> None:
        pass


class SpecialThing(Thing):
    """A proxy model: a job scheduled on one names the proxy (``testapp.SpecialThing``)."""

    class Meta:
        proxy = True


class Ticket(models.Model):
    """A model with a UUID primary key, which callers may give as text in any form."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4)

    @delayable
    def touch(self) -> None:
        pass


class Receipt(models.Model):
    """A model of the user's that refers to a job with ``on_delete=PROTECT``: the database
    refuses to delete a job one refers to."""

    job = models.ForeignKey("django_delayjobs.Job", on_delete=models.PROTECT)


class LoudThing(Thing):
    """A multi-table child of Thing: its row shares the Thing row's primary key, and a job
    scheduled on one names it (``testapp.LoudThing``)."""

    volume = models.IntegerField(default=0)

    @delayable
    def shout(self) -> None:
        LoudThing.objects.filter(pk=self.pk).update(volume=models.F("volume") + 1)
